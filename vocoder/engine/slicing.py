"""CPU slicing: how the engine cuts a decode_batch call into groups and slices and spreads them
over its decode workers (docs/vocoder.md, "Inside a decode_batch call")."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TypeVar

import torch

from codeclog.cores import one_per_core
from codeclog.vocoder.engine.window_checks import Window
from codeclog.vocoder.flow.parallel import RowThreads, row_parts

T = TypeVar("T")
R = TypeVar("R")
MAX_CPU_WORKERS = 4  # decode workers by default on CPU (see default_workers)


def default_workers(device: torch.device) -> int:
    """Decode workers: on CPU one per core up to 4 (each runs its slice with the engine's
    intra-op thread count, 1 by default); on an accelerator 1 (the device batches)."""
    if device.type != "cpu":
        return 1
    return one_per_core(MAX_CPU_WORKERS)


def equal_shape_groups(windows: Sequence[Window]) -> list[list[Window]]:
    """The exact path's groups: windows of one length, final flag and state signature."""
    groups: dict[Hashable, list[Window]] = {}
    for window in windows:
        key = (len(window.ids), window.final, window.state.signature())
        groups.setdefault(key, []).append(window)
    return list(groups.values())


def final_groups(windows: Sequence[Window]) -> list[list[Window]]:
    """The ragged path's groups: non-final windows, then final ones (at most two)."""
    groups = [[w for w in windows if not w.final], [w for w in windows if w.final]]
    return [group for group in groups if group]


def split(items: Sequence[T], parts: int) -> list[Sequence[T]]:
    """`items` in at most `parts` contiguous slices of near-equal size (order kept)."""
    return [items[rows] for rows in row_parts(len(items), parts)]


class DecodeWorkers:
    """`count` decode threads, started on first use. Each applies the engine's intra-op thread
    count to itself when it starts: torch keeps MKL's and OpenMP's counts per thread, and a new
    thread would otherwise run MKL's GEMMs on every core until its first parallel loop set them
    (other last bits on some CPUs: an emulated Intel AVX2 CPU gave a stream whose flow rows were
    split across the workers other audio than the same stream on one worker). `scope` is the
    engine's kernel scope, entered by every task run on a worker for the flow."""

    def __init__(
        self, count: int, threads: int, scope: Callable[[], AbstractContextManager[None]]
    ) -> None:
        self.count = count
        self._threads = threads
        self._scope = scope
        self._pool: ThreadPoolExecutor | None = None

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.count,
                thread_name_prefix="code2wav",
                initializer=torch.set_num_threads,
                initargs=(self._threads,),
            )
        return self._pool

    def map_slices(
        self, decode: Callable[[Sequence[T]], list[R]], slices: Sequence[Sequence[T]]
    ) -> list[R]:
        """Every slice decoded on a worker; their results joined in slice order."""
        futures = [self._executor().submit(decode, part) for part in slices]
        return [result for future in futures for result in future.result()]

    def row_threads(self) -> RowThreads | None:
        """The workers, for a flow whose estimator rows may run in parts (vocoder.flow
        .parallel), when there are workers to spare. Only for a batch-invariant decode: a
        part's rows are then the whole call's bytes."""
        if self.count < 2:
            return None
        return RowThreads(self._side_by_side, self.count)

    def _side_by_side(self, tasks: Sequence[Callable[[], T]]) -> list[T]:
        """Every task, the first in this thread and the others in the workers (each in the
        engine's scope); all have finished when this returns or raises."""
        futures = [self._executor().submit(self._in_scope, task) for task in tasks[1:]]
        try:
            first = tasks[0]()
        finally:
            concurrent.futures.wait(futures)
        return [first, *(future.result() for future in futures)]

    def _in_scope(self, task: Callable[[], T]) -> T:
        with self._scope(), torch.inference_mode():
            return task()
