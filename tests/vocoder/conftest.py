"""Shared by the vocoder tests: torch runs single-threaded.

Tiny ops are latency-bound; a second OpenMP thread only adds contention on a shared 2-core box,
and the engine itself defaults to one intra-op thread (vocoder.determinism).

`flow` (module): the tiny flow with 4 ODE steps, for the flow tests; a module that needs
another flow defines its own `flow`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def flow() -> Any:
    from tests.vocoder.flow_helpers import tiny_flow  # imports torch: only when asked for

    return tiny_flow(n_timesteps=4)
