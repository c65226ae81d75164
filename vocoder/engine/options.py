"""The engine's options (`EngineOptions`): their choices, their defaults and the combinations an
engine refuses to be built with (docs/vocoder.md, "Inside a decode_batch call")."""

from __future__ import annotations

from typing import TypedDict

import torch

from codeclog.vocoder.errors import VocoderConfigError
from codeclog.vocoder.kernels import Kernels
from codeclog.vocoder.voice import Voice

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# exact: equal-shape groups, every row byte-identical to its solo decode (the default);
# ragged: one flow and one HiFT call per final flag, rows within a measured bound of solo
BATCHING = ("exact", "ragged")


class EngineOptions(TypedDict, total=False):
    """The keywords of Code2WavEngine and of its constructors from_spec, tiny and load (which
    also take `hift`, the variant to load), every one optional."""

    device: str  # "cpu" (the default), "cuda", ...
    dtype: str  # the flow's: "float32" (the default), "bfloat16", "float16" (CUDA only)
    batch_invariant: bool | None  # None: on the CPU (rows byte-identical to solo decodes)
    threads: int | None  # intra-op threads (vocoder.determinism); None: its default
    workers: int | None  # decode workers; None: `vocoder.engine.slicing.default_workers`
    voice: Voice | None  # the default voice; None: `vocoder.voice.default_voice`
    kernels: str | Kernels | None  # "native" or "portable"; None: `default_kernels`
    batching: str  # "exact" (the default) or "ragged"


def check_choices(dtype: str, batching: str, causal: bool) -> None:
    """The dtype and the batching are known ones, and the causal HiFT batches exact."""
    if dtype not in DTYPES:
        raise VocoderConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if batching not in BATCHING:
        raise VocoderConfigError(f"batching must be one of {', '.join(BATCHING)}, got {batching!r}")
    if causal and batching == "ragged":
        raise VocoderConfigError(
            "the causal HiFT cannot batch ragged (vocoder.hift.rows is scheme A only): "
            "use batching exact"
        )


def check_placement(device: torch.device, kernels: Kernels, batching: str, dtype: str) -> None:
    """Portable kernels run on the CPU and batch exact; float16 runs on CUDA only."""
    if kernels is Kernels.PORTABLE and device.type != "cpu":
        raise VocoderConfigError("portable kernels run on the CPU only (use --kernels native)")
    if kernels is Kernels.PORTABLE and batching == "ragged":
        # the ragged path's row masks need ops the portable kernels do not define (&)
        raise VocoderConfigError(
            "ragged batching runs with native kernels only (its rows are within a bound of "
            "their solo decode, never portable bytes): use --kernels native"
        )
    if dtype == "float16" and device.type == "cpu":
        raise VocoderConfigError(half_precision_refusal())


def default_kernels(device: torch.device) -> Kernels:
    """Native: the portable kernels cost more than 2x the native RTF on CPU (BENCHMARKS.md,
    "Issue 15"), so they are chosen explicitly (`--kernels portable`, and replay's and
    verify's defaults); on an accelerator only native kernels exist."""
    del device
    return Kernels.NATIVE


def half_precision_refusal() -> str:
    """The one-line refusal of float16 on the CPU (bfloat16 runs there)."""
    return "float16 (half precision) is for CUDA; on the CPU use float32 or bfloat16"
