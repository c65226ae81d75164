"""The causal HiFT (scheme B) under portable kernels gives the same bytes on another CPU: every op
it runs is owned by vocoder/kernels/portable.py (float64 F0 convs and phase included), checked
here by decoding under qemu-user emulation of an Intel CPU and comparing with the native run.
Kept small for CI: tiny sizes, one stream of two windows (16 + 8 frames), one emulated CPU.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.vocoder.test_cross_cpu import REPO, _qemu

pytestmark = [pytest.mark.vocoder, pytest.mark.slow]
EMULATED_CPU = "Haswell-v4"
TIMEOUT_S = 540

SCRIPT = """
import hashlib, torch
from codeclog.vocoder.causal_hift import CausalHiftConfig, CausalVocoder
from codeclog.vocoder.causal_hift import build_causal_hift, initialise_causal_hift
from codeclog.vocoder.kernels import kernel_scope
torch.set_num_threads(1)
model = build_causal_hift(CausalHiftConfig.tiny())
initialise_causal_hift(model, 3)
vocoder = CausalVocoder(model)
mel = torch.randn(1, 80, 24, generator=torch.Generator().manual_seed(5)) - 5.0
digest = hashlib.sha256()
with torch.inference_mode(), kernel_scope("portable"):
    caches = [vocoder.empty_cache()]
    for part, final in ((mel[:, :, :16], False), (mel[:, :, 16:], True)):
        step = vocoder.step(caches, part, final)
        caches = step.caches
        digest.update(step.audio[0].numpy().tobytes())
print(digest.hexdigest())
"""


def _start(prefix: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*prefix, sys.executable, "-c", SCRIPT],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _digest(process: subprocess.Popen[str], label: str) -> str:
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"{label}: no digest within {TIMEOUT_S} s")
    assert process.returncode == 0, f"{label}: {stderr[-2000:]}"
    return stdout.strip().splitlines()[-1]


# ~70 s of CPU under emulation (half of it importing torch); minutes on a loaded 2-core box
@pytest.mark.nightly  # 64 s of CI; the scheme-A cross-CPU test stays in CI
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_portable_causal_hift_bytes_are_the_same_on_an_emulated_intel_cpu() -> None:
    qemu = _qemu()
    emulated = _start([qemu, "-cpu", EMULATED_CPU])  # the slow one starts first
    native = _digest(_start([]), "native run")
    assert len(native) == 64
    assert _digest(emulated, EMULATED_CPU) == native
