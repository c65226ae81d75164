"""The determinism domain: one short stable string naming everything that decides the bytes of a
decode, recorded with every audio chunk and checkpoint, so that two decodes can be compared
bytewise exactly when their domains are equal.

    portable1:torch2.15:x86_64                    portable kernels: any x86-64 CPU
    native:torch2.15:cpu:AuthenticAMD:AVX2:t1:m52 native CPU kernels: vendor, ISA level, threads,
                                                  rows per GEMM tile (vocoder.flow.stable)
    native:torch2.15:cuda13.2:NVIDIA-H200         native CUDA kernels (deterministic settings)

Environment knobs that change which native kernels run (MKL_CBWR, ONEDNN_MAX_CPU_ISA,
ATEN_CPU_CAPABILITY) add a `:env-<hash>` suffix. An engine appends what else decides its bytes
(`engine_domain_suffix`): `:bfloat16` / `:float16` for a flow not in float32, `:causal` for the
causal HiFT (scheme B), `:ragged` for ragged batching; the defaults add nothing, so a float32
scheme-A exact engine's domain is the bare one above. The portable domain carries a version number
(`portable1`): a change to vocoder/kernels that moves any byte must bump it. The native CPU
domain names the GEMM tile of batch-invariant decoding (`m52`: CPU_GEMM_TILE rows): before the
tiles (issue 61) it ended at `t1`, and its bytes were those of one GEMM per request row.
"""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

import torch

from codeclog.vocoder.determinism import DeterminismSettings, planned_settings
from codeclog.vocoder.flow.stable import CPU_GEMM_TILE
from codeclog.vocoder.kernels import Kernels
from codeclog.vocoder.shared import CAUSAL_DOMAIN_TAG, domain_hift_variant

PORTABLE_VERSION = 1
_KERNEL_ENV = ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")


def torch_release() -> str:
    """major.minor of torch: patch releases do not change kernels by policy, minor ones may."""
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def determinism_domain(
    device: torch.device, kernels: Kernels, settings: DeterminismSettings
) -> str:
    if kernels is Kernels.PORTABLE:
        return f"portable{PORTABLE_VERSION}:torch{torch_release()}:{platform.machine()}"
    parts = ["native", f"torch{torch_release()}"]
    if device.type == "cuda":
        parts += [f"cuda{torch.version.cuda}", _gpu_name(device)]
    else:
        parts += [device.type, cpu_vendor(), torch.backends.cpu.get_cpu_capability()]
        parts += [f"t{settings.threads}", f"m{CPU_GEMM_TILE}"]
    knobs = [f"{key}={value}" for key, value in settings.env if key in _KERNEL_ENV]
    if knobs:
        parts.append("env-" + hashlib.sha256("\n".join(knobs).encode()).hexdigest()[:8])
    return ":".join(parts)


def engine_domain_suffix(dtype: str, hift_variant: str, batching: str) -> str:
    """What an engine's options add to its domain (each a different domain: different bytes).
    `:ragged` last: a row's bytes then depend on its batch mates' shapes."""
    parts = [f":{dtype}"] if dtype != "float32" else []
    if hift_variant == CAUSAL_DOMAIN_TAG:
        parts.append(f":{CAUSAL_DOMAIN_TAG}")
    if batching == "ragged":
        parts.append(":ragged")
    return "".join(parts)


def hift_variant_reproducing(domains: frozenset[str]) -> str:
    """The HiFT variant that reproduces audio written in `domains`: causal when every window
    of a known domain was written by a causal engine, noncausal otherwise (the default)."""
    known = [domain for domain in domains if domain]
    causal = bool(known) and all(domain_hift_variant(d) == CAUSAL_DOMAIN_TAG for d in known)
    return CAUSAL_DOMAIN_TAG if causal else "noncausal"


def is_portable(domain: str) -> bool:
    return domain.startswith("portable")


def planned_domain(device: str, kernels: Kernels, threads: int | None = None) -> str:
    """The domain an engine built with these arguments here would have, without building it."""
    torch_device = torch.device(device)
    return determinism_domain(torch_device, kernels, planned_settings(torch_device, threads))


def kernels_reproducing(
    domains: frozenset[str], device: str, threads: int | None = None, suffix: str = ""
) -> Kernels:
    """The kernels that reproduce audio written in `domains` bytewise here: native when every
    window was written in this machine's native domain (plus the replaying engine's `suffix`,
    engine_domain_suffix), portable otherwise (portable audio is then compared bytewise,
    anything else by the numeric bound)."""
    native = planned_domain(device, Kernels.NATIVE, threads) + suffix
    if domains and all(domain == native for domain in domains):
        return Kernels.NATIVE
    return Kernels.PORTABLE


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """GenuineIntel, AuthenticAMD, ... (Intel and AMD take different library paths at one ISA
    level); the machine name where /proc/cpuinfo has no vendor line."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine() or "unknown"


def _gpu_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device).replace(" ", "-")
