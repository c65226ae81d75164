"""The real-package tier: codeclog inside the released vllm-omni (tests/vllm_omni_tier/).

scripts/bootstrap.sh builds, once per machine, the environment a vllm-omni user has (pip
resolving vllm-omni 0.30.0 with vllm 0.30.0, on Python 3.12: the one upstream's CI runs, and one
where the package's serving layer imports; docs/vllm-omni.md, "Versions"). This test installs the
checkout's codeclog into it as a user installs a package (a wheel, not an editable checkout),
then runs the tier there with pytest, against this session's broker: the real chunk transfer
adapter, the package's MiniCPM-o processor, the connector made by the real factory, upstream's
own connector cases, and shared memory as the baseline. Never skipped in CI; docs/testing.md
has its cost.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from codeclog.paths import default_cache_dir

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
TIER = ROOT / "tests" / "vllm_omni_tier"
ENV_OMNI_VENV = "CODECLOG_OMNI_VENV"


def _omni_python() -> Path:
    venv = Path(os.environ.get(ENV_OMNI_VENV) or default_cache_dir() / "omni-venv")
    python = venv / "bin" / "python"
    if not python.exists():
        message = f"no vllm-omni environment at {venv}: run scripts/bootstrap.sh (make setup)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python


@pytest.mark.timeout(1500)
def test_codeclog_inside_the_released_vllm_omni(kafka_bootstrap: str) -> None:
    python = _omni_python()
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    env = {**os.environ, "CODECLOG_BOOTSTRAP": kafka_bootstrap, "PYTHONPATH": ""}
    tier = subprocess.run(
        [str(python), "-m", "pytest", "-q", "."],
        cwd=TIER,
        env=env,
        capture_output=True,
        text=True,
        timeout=1440,
    )
    summary = tier.stdout[-6000:] + tier.stderr[-2000:]
    assert tier.returncode == 0, summary
    assert " passed" in summary and "skipped" not in summary, summary
