"""The estimator's rows on several threads: each row's bytes are those of the whole call
(docs/vocoder.md, "Rows on several threads")."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor


class Runner(Protocol):
    """Runs every task (possibly side by side) and returns their results in order."""

    def __call__(self, tasks: Sequence[Callable[[], Any]]) -> list[Any]: ...


MIN_ROW_MACS = 100_000_000  # estimator multiply-adds per row and call that make a part worth it


@dataclasses.dataclass(frozen=True)
class RowThreads:
    """Threads to spread rows over: `run` runs tasks side by side on at most `count` threads."""

    run: Runner
    count: int

    def parts(self, rows: int) -> list[slice]:
        return row_parts(rows, self.count)


def row_parts(rows: int, parts: int) -> list[slice]:
    """0..rows in at most `parts` contiguous slices of near-equal size, in order."""
    count = max(1, min(parts, rows))
    size, extra = divmod(rows, count)
    bounds = [0]
    for index in range(count):
        bounds.append(bounds[-1] + size + (1 if index < extra else 0))
    return [slice(start, stop) for start, stop in itertools.pairwise(bounds)]


def estimate_in_parts(
    estimator: Callable[..., tuple[Tensor, Tensor]],
    threads: RowThreads,
    x: Tensor,
    mu: Tensor,
    conditioning: Any,
    spks: Tensor,
    cond: Tensor,
    cnn_cache: Tensor | None,
    att_cache: Tensor | None,
    att_out: Tensor,
) -> tuple[Tensor, Tensor]:
    """`estimator(x, mu, conditioning, spks, cond, cnn_cache, att_cache, att_out)`
    (DiT.forward_chunk over
    N rows: x, mu, cond (N, mel, F), spks (N, mel), caches and att_out with rows on axis 1), one
    part of the rows per task. att_out is written in place, each part its own rows."""

    def part(rows: slice) -> Callable[[], tuple[Tensor, Tensor]]:
        return lambda: estimator(
            x[rows],
            mu[rows],
            conditioning,
            spks[rows],
            cond[rows],
            cnn_cache[:, rows] if cnn_cache is not None else None,
            att_cache[:, rows] if att_cache is not None else None,
            att_out[:, rows],
        )

    results = threads.run([part(rows) for rows in threads.parts(x.shape[0])])
    return torch.cat([r[0] for r in results]), torch.cat([r[1] for r in results], dim=1)
