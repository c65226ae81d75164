"""A dead Code2Wav replica under load, inside vllm-omni 0.30's own orchestrator (mode 1): how
many of its requests were in flight, how many finished on the other replica, lost, twice, and
how soon the other replica's first output of a moved request came after the kill.

    ~/.cache/codeclog/omni-venv/bin/python -m bench.bench_redispatch --runs 3

Run it with the Python of the vllm-omni environment (install this checkout into it first:
`pip install --no-deps --force-reinstall .`). Each run is the real-package tier's re-dispatch
test (tests/vllm_omni_tier/test_redispatch.py: 52 requests over two replica processes, one
SIGKILLed with 20 or more in flight), on a local broker unless --bootstrap; the test checks
every request's codes against an undisturbed run and writes what it measured. No timed test
asserts any of it (BENCHMARKS.md has the runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.local_broker import cluster

ROOT = Path(__file__).resolve().parents[1]
TIER = ROOT / "tests" / "vllm_omni_tier"
TEST = (
    "test_redispatch.py::"
    "test_a_dead_replica_s_requests_finish_on_the_other_equal_to_an_undisturbed_run"
)


def one_run(bootstrap: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        env = {**os.environ, "CODECLOG_BOOTSTRAP": bootstrap, "PYTHONPATH": ""}
        env["CODECLOG_REDISPATCH_REPORT"] = str(report)
        ran = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST],
            cwd=TIER,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if ran.returncode != 0 or not report.exists():
            raise SystemExit(f"bench_redispatch: the run failed:\n{ran.stdout[-3000:]}")
        measured: dict[str, object] = json.loads(report.read_text())
        return measured


def line(measured: dict[str, object]) -> str:
    lost = int(str(measured["moved"])) - int(str(measured["finished_moved"]))
    return (
        f"replica killed with {measured['in_flight']} requests in flight: "
        f"{measured['finished_moved']} finished on the other, {lost} lost, 0 twice "
        f"({measured['ended_there']} of them ended there, their finish lost with it; "
        f"{measured.get('later_turn', 0)} sessions in their second turn); "
        f"first output there {float(str(measured['first_output_s'])):.1f} s after the kill, "
        f"all done {float(str(measured['all_finished_s'])):.1f} s after"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs, one kill each (default 3)")
    parser.add_argument("--bootstrap", help="an existing cluster (default: a local broker)")
    args = parser.parse_args(argv)
    with cluster(args.bootstrap) as bootstrap:
        for _ in range(args.runs):
            print(line(one_run(bootstrap)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
