"""The peak memory of a block of code above its level at entry: torch's CUDA allocations, or on
the CPU the process's resident set, sampled on a thread every `interval_s` (after returning the
freed heap to the system, so that the level at entry is what is really held)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import threading
from collections.abc import Iterator

import torch


class PeakMemory:
    """The peak above the level at entry: CUDA allocations, or the process's resident set
    sampled every `interval_s` on the CPU (after returning freed heap memory to the system)."""

    def __init__(self, device: torch.device, interval_s: float = 0.002) -> None:
        self.device = device
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()

    @contextlib.contextmanager
    def measuring(self) -> Iterator[PeakMemory]:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield self
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - base
            return
        _trim_heap()
        base = _rss_bytes()
        top = [base]
        sampler = threading.Thread(target=self._sample, args=(top,), daemon=True)
        sampler.start()
        try:
            yield self
        finally:
            self._stop.set()
            sampler.join()
            self.peak_bytes = max(top[0], _rss_bytes()) - base

    def _sample(self, top: list[int]) -> None:
        while not self._stop.wait(self.interval_s):
            top[0] = max(top[0], _rss_bytes())


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _trim_heap() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
