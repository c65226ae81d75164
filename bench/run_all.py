"""Run every benchmark once, one after the other, and print their tables (for BENCHMARKS.md).

    python -m bench.run_all            # everything (starts local brokers where needed)
    python -m bench.run_all --quick    # smaller sizes, for a smoke run
    python -m bench.run_all --quick --only bench_fold bench_lag

Each benchmark prints ratios measured side by side in the same run; none is a timed test.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]  # where `python -m bench.NAME` finds bench

FULL: list[tuple[str, list[str]]] = [
    ("wire codec", ["wire_codec"]),
    ("fold vs decode (issue 3)", ["bench_fold", "--sessions", "1000", "--turns", "4"]),
    ("state-only replay (issue 5)", ["bench_replay", "--sessions", "1000"]),
    ("report at scale in Chromium (issue 41)", ["bench_report"]),
    ("lag evaluation (issue 9)", ["bench_lag", "--partitions", "10000"]),
    ("publisher (issue 4)", ["bench_publisher", "--records", "20000", "--rate", "200"]),
    ("flow (issue 6)", ["bench_flow", "--configs", "tiny,full", "--batches", "1,4,16"]),
    ("vocoder end to end (issue 7)", ["bench_vocoder"]),
    ("ragged batching (issue 23)", ["bench_ragged", "--seconds", "4"]),
    ("causal HiFT in the engine (issue 23)", ["bench_engine_hift", "--configs", "tiny"]),
    ("consumer (issue 8)", ["bench_consumer", "--streams", "2", "10", "100", "--seconds", "15"]),
    ("one transaction per step (issue 8)", ["bench_transaction"]),
    ("listener floor (issue 22)", ["bench_listener_floor"]),
]
QUICK_ARGS = {
    "bench_fold": ["--sessions", "200"],
    "bench_replay": ["--sessions", "200"],
    "bench_report": ["--sessions", "300"],
    "bench_publisher": ["--records", "2000", "--rate", "100", "--paced-seconds", "2"],
    "bench_flow": ["--configs", "tiny", "--batches", "1,4"],
    "bench_ragged": ["--streams", "10", "--seconds", "1", "--bound-seeds", "1"],
    "bench_engine_hift": ["--configs", "tiny", "--windows", "3"],
    "bench_consumer": ["--streams", "4", "--seconds", "5"],
    "bench_transaction": ["--steps", "50", "--warm-s", "2"],
    "bench_listener_floor": ["--streams", "4", "--seconds", "3", "--warm-s", "3"],
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="*", help="benchmark names to run (default: all)")
    args = parser.parse_args()
    failed = 0
    for title, command in FULL:
        script = command[0]
        if args.only and script not in args.only:
            continue
        argv = [script, *QUICK_ARGS[script]] if args.quick and script in QUICK_ARGS else command
        module = ["-m", f"bench.{argv[0]}", *argv[1:]]
        print(f"\n## {title}\n\n$ python {' '.join(module)}\n", flush=True)
        started = time.monotonic()
        code = subprocess.call([sys.executable, *module], cwd=CHECKOUT)
        print(f"\n(exit {code}, {time.monotonic() - started:.0f} s)", flush=True)
        failed += code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
