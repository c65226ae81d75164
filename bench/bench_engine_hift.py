"""CPU cost per row of the streaming engine with the causal HiFT (`--hift causal`, scheme B)
against the default non-causal HiFT (scheme A): whole windows, flow included.

    python bench/bench_engine_hift.py                      # tiny and full sizes, 1 thread
    python bench/bench_engine_hift.py --configs tiny --windows 12

Two engines of the same flow weights (tiny: the committed fixture and the seeded causal
fixture; full: seeded random weights at the published sizes) decode one row (batch 1) of
canonical 28-id windows (25 new codec frames, 1.0 s of audio each) after one untimed warm-up
window; A and B take turns window by window, so a shared machine's load hits both alike. The
engine's decode runs the flow then the HiFT; the flow's share is the same for both, so B / A
here is below the vocoder-only ratio of bench/bench_causal_hift.py. Native kernels, 1 worker.
Prints best and mean seconds per window, the RTF (best s per 1.0 s window) and B / A.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from codeclog.vocoder.causal_hift import (  # noqa: E402
    CausalHiftConfig,
    build_causal_hift,
    initialise_causal_hift,
)
from codeclog.vocoder.engine import Code2WavEngine  # noqa: E402
from codeclog.vocoder.flow import FlowConfig, Token2WavFlow  # noqa: E402
from codeclog.vocoder.hift import HiftConfig, build_hift, initialise_hift  # noqa: E402

SILENCE = 4218


def engines(name: str, threads: int) -> tuple[Code2WavEngine, Code2WavEngine]:
    options = {"kernels": "native", "workers": 1, "threads": threads}
    if name == "tiny":
        return (
            Code2WavEngine.tiny(**options),  # type: ignore[arg-type]
            Code2WavEngine.tiny(hift="causal", **options),  # type: ignore[arg-type]
        )
    hift = build_hift(HiftConfig.full())
    initialise_hift(hift, 0)
    causal = build_causal_hift(CausalHiftConfig.full())
    initialise_causal_hift(causal, 0)
    # the flow is seeded by FlowConfig.init_seed: both engines get the same weights
    a = Code2WavEngine(Token2WavFlow(FlowConfig.full()), hift, spec="full", **options)  # type: ignore[arg-type]
    b = Code2WavEngine(Token2WavFlow(FlowConfig.full()), causal, spec="full", **options)  # type: ignore[arg-type]
    return a, b


def windows(count: int) -> list[list[int]]:
    """count + 1 canonical non-final windows: 25 new ids + 3 lookahead, overlapping by 3."""
    ids = [SILENCE] * 3 + [(i * 7919 + 13) % 6561 for i in range(25 * (count + 1))]
    return [ids[start : start + 28] for start in range(0, 25 * (count + 1), 25)]


def measure(name: str, count: int, threads: int) -> tuple[list[float], list[float]]:
    a, b = engines(name, threads)
    state_a, state_b = a.setup(seed=1), b.setup(seed=1)
    times_a: list[float] = []
    times_b: list[float] = []
    for index, window in enumerate(windows(count)):
        start = time.perf_counter()
        [(_, state_a)] = a.decode_batch([(state_a, window, False)])
        middle = time.perf_counter()
        [(_, state_b)] = b.decode_batch([(state_b, window, False)])
        end = time.perf_counter()
        if index:  # the first window warms up
            times_a.append(middle - start)
            times_b.append(end - middle)
    return times_a, times_b


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--configs", default="tiny,full", help="comma list of tiny, full")
    parser.add_argument("--windows", type=int, default=None, help="timed windows (tiny 8, full 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    names = [n for n in args.configs.split(",") if n]
    if any(n not in ("tiny", "full") for n in names) or (args.windows or 1) < 1:
        print("--configs takes tiny and/or full; --windows must be >= 1", file=sys.stderr)
        return 2
    lines = [
        "| sizes | windows | A best s | A mean s | B best s | B mean s | RTF A | RTF B | B / A |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        count = args.windows or (8 if name == "tiny" else 3)
        ta, tb = measure(name, count, args.threads)
        ratio = min(tb) / min(ta)
        lines.append(
            f"| {name} | {count} | {min(ta):.3f} | {statistics.mean(ta):.3f} | {min(tb):.3f} "
            f"| {statistics.mean(tb):.3f} | {min(ta):.3f} | {min(tb):.3f} | {ratio:.2f} |"
        )
        print(lines[-1], file=sys.stderr)
    command = "python bench/bench_engine_hift.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    print(
        f"Engine, one row: --hift causal (B) vs noncausal (A), flow + HiFT per window, "
        f"torch {torch.__version__}, {args.threads} thread(s)\n\n"
        + "\n".join(lines)
        + f"\n\nCommand: `{command}`"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
