"""`python -m bench.device_check` rehearsed on the CPU in --quick mode (tiny sizes): it runs with
only torch and numpy importable (pyyaml, safetensors, Kafka and Avro clients are blocked, as on
the GPU machine), writes one JSON and one Markdown report with every section, and its global time
guard turns a spent budget into skipped sections, never into a missing report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vocoder
REPO = Path(__file__).resolve().parents[2]
SECTIONS = ("hift_a", "hift_b", "flow", "first_window", "engine", "mixed_positions",
            "determinism", "memory", "cpu_difference")  # fmt: skip
BLOCKED = ("yaml", "safetensors", "fastavro", "avro", "confluent_kafka", "scipy", "einops")
RUNNER = f"""
import importlib.abc, runpy, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"blocked on the device machine: {{name}}", name=name)
sys.meta_path.insert(0, Block())
runpy.run_module("bench.device_check", run_name="__main__", alter_sys=True)
"""


def _run(tmp_path: Path, *args: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, "--quick", "--device", "cpu", "--out", str(tmp_path), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "device_check.md").read_text().startswith("# Device check")
    return json.loads((tmp_path / "device_check.json").read_text())  # type: ignore[no-any-return]


def test_quick_run_reports_every_section_with_torch_and_numpy_only(tmp_path: Path) -> None:
    results = _run(tmp_path)
    for name in SECTIONS:
        assert name in results, name
    for part in ("flow", "hift_a", "hift_b", "engine"):
        rows = results[part]
        assert isinstance(rows, list) and [r["batch"] for r in rows] == [1, 2], part
        assert all(r["rtf_per_stream"] > 0 and r["audio_s_per_wall_s"] > 0 for r in rows)
    assert results["determinism"]["identical"] is True  # type: ignore[index]
    mixed = results["mixed_positions"]
    assert isinstance(mixed, dict) and mixed["flow_calls"] >= 1 and mixed["hift_calls"] >= 1
    assert results["memory"] == {"skipped": "no CUDA device"}


def test_a_spent_budget_skips_sections_but_still_writes_the_report(tmp_path: Path) -> None:
    results = _run(tmp_path, "--budget-s", "0")
    for name in SECTIONS:
        assert results[name] == {"skipped": "global time guard"}, name
