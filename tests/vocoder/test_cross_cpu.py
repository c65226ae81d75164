"""The portable kernels give the same audio bytes on other CPUs: the golden stream is decoded
under qemu-user emulation of an Intel and an AMD CPU (determinism.md) and must hash exactly as
the native run. Native kernels differ there (that is why the portable ones exist), so this test
is what makes "replay anywhere, bit for bit" a checked claim.

qemu-user is installed by scripts/bootstrap.sh (Debian's qemu-user). Outside CI a machine
without it skips; in CI (CI=true) a missing qemu fails.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vocoder.test_engine_processes import DECODE_SCRIPT

pytestmark = [pytest.mark.vocoder, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
# One Intel and one AMD model with AVX2 (qemu's TCG emulates no AVX-512): torch, oneDNN and
# MKL take vendor- and ISA-specific paths on each (determinism.md lists their native digests).
EMULATED_CPUS = ("Haswell-v4", "EPYC-Rome")
EMULATION_TIMEOUT_S = 240


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


GOLDEN = (DECODE_SCRIPT, "7", "portable")  # the golden stream, seed 7, portable kernels


def _same_bytes_under(cpu: str) -> None:
    emulated = decode([_qemu(), "-cpu", cpu], *GOLDEN)
    here = digest(decode([], *GOLDEN), "native run")
    assert len(here) == 64
    assert digest(emulated, cpu) == here, f"portable bytes differ under {cpu}"


def test_portable_golden_bytes_are_the_same_on_an_emulated_intel() -> None:
    _same_bytes_under(EMULATED_CPUS[0])


@pytest.mark.long  # 40-50 s more of CI; the Intel model above runs the same kernels in CI
def test_portable_golden_bytes_are_the_same_on_an_emulated_amd() -> None:
    _same_bytes_under(EMULATED_CPUS[1])
