"""The README's two commands are real: exactly two, wired to the Makefile and CI, and the main
one (the demo) runs end to end on the local broker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _first_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```\n(.*?)```", text, re.S)
    assert block is not None, "the README starts with a code block of set-up commands"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_readme_starts_with_exactly_the_two_commands() -> None:
    assert _first_block() == ["make demo", "make test"]


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci/run").read_text()
    assert re.search(r"^make test$", ci, re.M)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: setup$", makefile, re.M)
    assert "pytest" in makefile and "mypy" in makefile and "ruff check" in makefile


@pytest.mark.kafka
@pytest.mark.vocoder
@pytest.mark.slow
def test_make_demo_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    env = {
        **os.environ,
        "CODECLOG_VENV": sys.prefix,
        "DEMO_ARGS": f"--sessions 2 --seconds 6 --out {out}",
    }
    result = subprocess.run(
        ["make", "demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "verify" in result.stdout and "exactly once, byte-identical" in result.stdout
    assert list((out / "wav").glob("*.wav")), "one WAV per request"
    assert (out / "summary.json").exists() and (out / "latency_lag.png").exists()
    report = (out / "report.html").read_text()  # the incident report of the demo's capture
    assert (out / "chunks.ocf").exists() and "codeclog incident report" in report
