"""The benchmarks are a package run as `python -m bench.NAME` from the checkout's root: no script
edits sys.path to find the checkout, mypy checks them with the rest, and no test imports them
(what a test and a benchmark share lives in codeclog.devtools)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORTS_BENCH = re.compile(r"^\s*(from\s+bench[.\s]|import\s+bench\b)", re.M)


def test_no_bench_script_edits_sys_path() -> None:
    editing = [p.name for p in sorted((ROOT / "bench").glob("*.py")) if "sys.path" in p.read_text()]
    assert editing == []
    assert (ROOT / "bench" / "__init__.py").exists()


def test_mypy_checks_the_benchmarks() -> None:
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert "bench" in settings["packages"]


def test_no_test_imports_bench() -> None:
    importing = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if IMPORTS_BENCH.search(path.read_text())
    ]
    assert importing == []
