"""The member's malloc arena cap: with it, threads that allocate at the same time share at most
two arenas; without it, glibc gives each its own (what held a member's freed memory)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from codeclog.malloc_arenas import ENV_ARENA_MAX

# Eight threads alive at once, each allocating blocks above pymalloc's size (malloc itself);
# malloc_stats() then prints one "Arena N:" paragraph per arena to stderr.
PROGRAM = """
import ctypes, sys, threading
from codeclog.malloc_arenas import cap_arenas
if sys.argv[1] == "cap":
    assert cap_arenas(2)
if sys.argv[1] == "vocode":  # the member's own start: it caps, then refuses the empty group
    from codeclog.cli import main
    assert main(["vocode", "--group", " "]) == 2
barrier = threading.Barrier(8)
def work():
    blocks = [bytearray(4096 + n) for n in range(200)]
    barrier.wait()
    del blocks
threads = [threading.Thread(target=work) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
ctypes.CDLL(None).malloc_stats()
"""


def _arenas(mode: str) -> int:
    """Arenas of a child running PROGRAM in `mode`, without an operator's MALLOC_ARENA_MAX (it
    would stand instead of the cap, and cap the uncapped run too)."""
    env = {name: value for name, value in os.environ.items() if name != ENV_ARENA_MAX}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, env=env, check=True
    )
    return sum(line.startswith("Arena ") for line in done.stderr.splitlines())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_threads_that_allocate_at_once_share_two_arenas_once_capped() -> None:
    assert _arenas("free") > 2  # glibc: an arena per thread, up to 8 per core
    assert _arenas("cap") <= 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_vocode_process_caps_its_arenas_as_it_starts() -> None:
    """`codeclog vocode` sets the cap first in `run()`, before its options are checked: a
    process that went through it shares two arenas among eight allocating threads."""
    assert _arenas("vocode") <= 2


def test_an_operators_malloc_arena_max_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    from codeclog.malloc_arenas import cap_arenas

    monkeypatch.setenv(ENV_ARENA_MAX, "4")
    assert cap_arenas() is False
