"""`python -m bench.bench_vs_vllm_omni --quick` in the released vllm-omni environment: the bench
builds vllm-omni 0.30's own BatchedToken2Wav on codeclog's tiny fixture, decodes the same streams
through both and prints its lines, its table and its command. What is asserted holds on any CPU:
the report's shape, codeclog's audio within the cross-domain bound of the peer's (both decode the
same weights and, in the compare pass, the same noise) and codeclog's batch invariance; never a
speed. The environment is scripts/bootstrap.sh's (tests/omni/test_vllm_omni_tier.py): missing, the
test skips on a developer box and fails in CI, as does minicpmo-utils 1.0.7 (the peer's flow)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from codeclog.paths import default_cache_dir
from tests.vocoder.reference import CAUSAL_INSTALL, causal_reference_root, in_ci

pytestmark = [pytest.mark.vocoder, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
ENV_OMNI_VENV = "CODECLOG_OMNI_VENV"
LINE = re.compile(
    r"^b=(\d+): codeclog [\d.]+ windows/s, vllm-omni [\d.]+ windows/s: [\d.]+x; "
    r"(bit-exact|SNR ([\d.]+) dB, max (\d+) LSB)$",
    re.M,
)


def _missing(message: str) -> None:
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)


def _omni_python() -> Path:
    venv = Path(os.environ.get(ENV_OMNI_VENV) or default_cache_dir() / "omni-venv")
    python = venv / "bin" / "python"
    if not python.exists():
        _missing(f"no vllm-omni environment at {venv}: run scripts/bootstrap.sh (make setup)")
    flow = Path(causal_reference_root()) / "stepaudio2" / "cosyvoice2" / "flow" / "flow.py"
    if not flow.is_file():
        _missing(f"minicpmo-utils 1.0.7 is missing ({CAUSAL_INSTALL})")
    return python


@pytest.mark.timeout(600)
def test_quick_run_compares_both_on_the_tiny_fixture(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    done = subprocess.run(
        [str(_omni_python()), "-m", "bench.bench_vs_vllm_omni", "--quick", "--out", str(report)],
        cwd=REPO,  # `python -m` from the checkout: its codeclog and bench, not an installed one
        env={**os.environ, "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    text = report.read_text()
    lines = LINE.findall(text)
    assert [int(batch) for batch, *_ in lines] == [1, 2], text
    for _, exact, snr, lsb in lines:  # the cross-domain bound (consumers.readers.audio_compare)
        assert exact == "bit-exact" or (float(snr) >= 40 and int(lsb) <= 32), text
    rows = [line for line in text.splitlines() if line.startswith("| 2 | codeclog |")]
    assert len(rows) == 1 and rows[0].endswith("| identical |"), text  # batch invariance
    assert "| 2 | vllm-omni |" in text and "Command: `python -m bench.bench_vs_vllm_omni" in text
