"""The causal HiFT (scheme B) under portable kernels gives the same bytes on another CPU: every op
it runs is owned by vocoder/kernels/portable.py (float64 F0 convs and phase included), checked
here by decoding under qemu-user emulation of an Intel CPU and comparing with the native run.
Kept small for CI: tiny sizes, one stream of two windows (16 + 8 frames), one emulated CPU.
"""

from __future__ import annotations

import pytest

from tests.vocoder.test_cross_cpu import _qemu, decode, digest

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


# ~70 s of CPU under emulation (half of it importing torch); minutes on a loaded 2-core box
@pytest.mark.long  # 64 s of CI; the scheme-A cross-CPU test stays in CI
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_portable_causal_hift_bytes_are_the_same_on_an_emulated_intel_cpu() -> None:
    qemu = _qemu()
    emulated = decode([qemu, "-cpu", EMULATED_CPU], SCRIPT)  # the slow one starts first
    native = digest(decode([], SCRIPT), "native run", TIMEOUT_S)
    assert len(native) == 64
    assert digest(emulated, EMULATED_CPU, TIMEOUT_S) == native
