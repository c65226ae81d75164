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
    assert re.search(r"^test: setup(\s|$)", makefile, re.M)
    assert "pytest" in makefile and "mypy" in makefile and "ruff check" in makefile


def test_make_help_lists_every_target_one_line_each() -> None:
    makefile = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.M)
    assert phony is not None
    targets = phony.group(1).split()
    defined = re.findall(r"^([a-z-]+):", makefile, re.M)
    assert sorted(defined) == sorted(targets)
    helped = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True)
    assert helped.returncode == 0, helped.stderr
    lines = helped.stdout.splitlines()
    assert [line.split()[0] for line in lines] == defined
    assert all(len(line.split()) > 1 for line in lines)  # each says what it does


def test_make_demo_installs_only_what_the_demo_needs() -> None:
    """`make demo` bootstraps the demo target (no vllm-omni environment, browser, qemu,
    Toxiproxy); `make test` the test target."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: setup-demo(\s|$)", makefile, re.M)
    assert "bootstrap.sh demo" in makefile and "bootstrap.sh test" in makefile
    script = (ROOT / "scripts" / "bootstrap.sh").read_text()
    demo_part = script[: script.index('if [ "$target" = demo ]; then')]
    demo_part = "\n".join(line for line in demo_part.splitlines() if not line.startswith("#"))
    for test_only in ("omni-venv", "chromium", "qemu", "toxiproxy", "apt-get", "stepaudio2"):
        assert test_only not in demo_part.lower(), test_only


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
