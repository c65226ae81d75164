"""The portable kernels give the same audio bytes on other CPUs: the golden stream (scheme A) and a
causal HiFT stream (scheme B) are decoded under qemu-user emulation of an Intel and an AMD CPU
(determinism.md) and must hash exactly as the native run. Native kernels differ there (that is
why the portable ones exist), so these tests are what make "replay anywhere, bit for bit" a
checked claim.

An emulated decode is one core's work for minutes (most of it importing torch), so the module
starts every emulation the session selected at once, at its first test, and each test waits for
its own: on a 2-core machine the three take about half their time in turn (210-219 s, not 450).

qemu-user is installed by scripts/bootstrap.sh (Debian's qemu-user). Outside CI a machine
without it skips; in CI (CI=true) a missing qemu fails.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.vocoder.test_engine_processes import DECODE_SCRIPT

pytestmark = [pytest.mark.vocoder, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
# One Intel and one AMD model with AVX2 (qemu's TCG emulates no AVX-512): torch, oneDNN and
# MKL take vendor- and ISA-specific paths on each (determinism.md lists their native digests).
INTEL, AMD = "Haswell-v4", "EPYC-Rome"
EMULATION_TIMEOUT_S = 540  # three emulations sharing two cores, on a loaded machine

GOLDEN = (DECODE_SCRIPT, "7", "portable")  # the golden stream, seed 7, portable kernels

# The causal HiFT at tiny sizes, one stream of two windows (16 + 8 frames): every op it runs is
# owned by vocoder/kernels/portable.py (float64 F0 convs and phase included)
CAUSAL_SCRIPT = """
import hashlib, torch
from codeclog.vocoder.hift.causal import CausalHiftConfig, build_causal_hift, initialise_causal_hift
from codeclog.vocoder.hift.causal_stream import CausalVocoder
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
CAUSAL = (CAUSAL_SCRIPT,)

# run -> the emulated CPU and the decode it checks
EMULATIONS = {
    "golden-intel": (INTEL, GOLDEN),
    "golden-amd": (AMD, GOLDEN),
    "causal-intel": (INTEL, CAUSAL),
}


def _qemu() -> str:
    found = shutil.which("qemu-x86_64")
    if platform.machine() != "x86_64":
        pytest.skip("cross-CPU emulation is checked on x86-64 hosts")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("qemu-x86_64 is missing: scripts/bootstrap.sh installs Debian's qemu-user")
        pytest.skip("qemu-x86_64 not installed (apt-get install qemu-user)")
    return found


def decode(prefix: list[str], script: str = DECODE_SCRIPT, *args: str) -> subprocess.Popen[str]:
    """`script` (printing a digest last) in a new process, under `prefix` (e.g. qemu)."""
    return subprocess.Popen(
        [*prefix, sys.executable, "-c", script, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONHASHSEED": "7"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def digest(
    process: subprocess.Popen[str], label: str, timeout_s: float = EMULATION_TIMEOUT_S
) -> str:
    """The last line the process printed, or a failure naming `label`."""
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"{label}: no digest within {timeout_s} s")
    assert process.returncode == 0, f"{label}: {stderr[-2000:]}"
    return stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def emulated(request: pytest.FixtureRequest) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """The emulated decodes of every run of this module the session selected, started together."""
    qemu = _qemu()
    selected = {
        item.callspec.params["run"]
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.module is request.module
    }
    running = {
        run: decode([qemu, "-cpu", cpu], *args)
        for run, (cpu, args) in EMULATIONS.items()
        if run in selected
    }
    yield running
    for process in running.values():
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.timeout(EMULATION_TIMEOUT_S + 60)
@pytest.mark.parametrize(
    "run",
    [
        "golden-intel",
        # long: golden-intel runs the same kernels in the quick run; in CI both run at once
        pytest.param("golden-amd", marks=pytest.mark.long),
        # long: the golden runs check the shared kernels; in CI it runs beside them
        pytest.param("causal-intel", marks=pytest.mark.long),
    ],
)
def test_portable_bytes_are_the_same_on_an_emulated_cpu(
    emulated: dict[str, subprocess.Popen[str]], run: str
) -> None:
    cpu, args = EMULATIONS[run]
    here = digest(decode([], *args), "native run")
    assert len(here) == 64
    assert digest(emulated[run], cpu) == here, f"portable bytes differ under {cpu}"
