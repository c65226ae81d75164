"""Determinism of the vocoder: seeds derived from stream identity, and the torch settings that
make a decode repeatable (docs/determinism.md).

Seeds: every random draw of the vocoder comes from a generator seeded here, never from the
global RNG. `stream_seed` is a pure function of (request id, cache epoch), stable across
processes, machines and Python hash seeds (sha256, not `hash()`); `window_seed` derives the HiFT
noise seed of one decode window from it.

Settings: on CPU, a fixed thread count, one inter-op thread and deterministic algorithms
(`torch.set_deterministic_debug_mode("error")`, the flag `torch.use_deterministic_algorithms(True)`
sets, without importing torch._inductor); on CUDA also the cuBLAS workspace, deterministic
cuDNN without benchmarking, and TF32 off. These are process-wide torch settings: applying them
changes them for everything else in the process (nothing else in codeclog uses torch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import torch

# Re-exported: the seeds live in the torch-free vocoder.shared (the consumer uses them too).
from codeclog.vocoder.shared import stream_seed as stream_seed
from codeclog.vocoder.shared import window_seed as window_seed

# Fixed, not os.cpu_count(): results may depend on the thread count. One thread because on a
# shared 2-core box two OpenMP threads spin against other work and run 5-20x slower (measured
# on the tiny model); pass `threads` for a dedicated many-core replay box.
DEFAULT_CPU_THREADS = 1
CUBLAS_WORKSPACE_CONFIG = ":4096:8"  # needed by deterministic cuBLAS; must precede CUDA init


@dataclasses.dataclass(frozen=True)
class DeterminismSettings:
    """What was applied, so that a run can record it next to its output."""

    device_type: str  # "cpu" or "cuda"
    threads: int  # torch intra-op threads
    interop_threads: int
    deterministic_algorithms: bool
    cudnn_deterministic: bool | None  # None on CPU
    tf32: bool | None  # None on CPU; False when TF32 is off for matmul and cuDNN
    env: tuple[tuple[str, str], ...]  # determinism-relevant environment variables as seen

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


_ENV_KEYS = (
    "CUBLAS_WORKSPACE_CONFIG",
    "MKL_CBWR",
    "ONEDNN_MAX_CPU_ISA",
    "ATEN_CPU_CAPABILITY",
    "OMP_NUM_THREADS",
)


def apply_determinism(device: torch.device, threads: int | None = None) -> DeterminismSettings:
    """Apply the deterministic settings for `device` and report them.

    threads: intra-op threads (CPU); default DEFAULT_CPU_THREADS. For bit-identical replay on
    another machine, also export MKL_CBWR=AVX2, ONEDNN_MAX_CPU_ISA=AVX2 and
    ATEN_CPU_CAPABILITY=avx2 before starting Python (not established for this stack).
    """
    count = DEFAULT_CPU_THREADS if threads is None else threads
    if count < 1:
        raise ValueError(f"threads must be >= 1, got {count}")
    torch.set_num_threads(count)
    _set_interop_threads(1)
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
        _apply_cuda_flags()
    # = torch.use_deterministic_algorithms(True) for eager ops, which is all this vocoder runs;
    # that function also sets torch._inductor's config, and importing torch._inductor (with
    # torch._dynamo) took 3 s of every process that builds an engine.
    torch.set_deterministic_debug_mode("error")
    return current_settings(device)


def _set_interop_threads(count: int) -> None:
    if torch.get_num_interop_threads() == count:
        return
    # torch allows this once, before any inter-op work; the engine runs no inter-op parallel
    # work itself, so a larger pool left by earlier code does not change results
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(count)


def _apply_cuda_flags() -> None:
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def planned_settings(device: torch.device, threads: int | None = None) -> DeterminismSettings:
    """What apply_determinism(device, threads) would report, without applying anything."""
    count = DEFAULT_CPU_THREADS if threads is None else threads
    cuda = device.type == "cuda"
    return DeterminismSettings(
        device_type=device.type,
        threads=count,
        interop_threads=1,
        deterministic_algorithms=True,
        cudnn_deterministic=True if cuda else None,
        tf32=False if cuda else None,
        env=tuple((key, os.environ[key]) for key in _ENV_KEYS if key in os.environ),
    )


def current_settings(device: torch.device) -> DeterminismSettings:
    cuda = device.type == "cuda"
    tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32
    return DeterminismSettings(
        device_type=device.type,
        threads=torch.get_num_threads(),
        interop_threads=torch.get_num_interop_threads(),
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic) if cuda else None,
        tf32=bool(tf32) if cuda else None,
        env=tuple((key, os.environ[key]) for key in _ENV_KEYS if key in os.environ),
    )
