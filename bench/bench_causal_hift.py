"""CPU cost per row of the causal HiFT (scheme B) against today's HiFT (scheme A).

    python -m bench.bench_causal_hift                      # tiny and full sizes, 1 thread
    python -m bench.bench_causal_hift --configs full --windows 2

One row (batch 1) streams canonical 50-frame mel windows (1.0 s of audio each) through each
vocoder, after one untimed warm-up window; A and B take turns window by window, so a shared
machine's load hits both alike. Prints the best and mean seconds per window, the RTF (best
seconds per 1.0 s window) and B / A. Weights are the seeded fixture init at either size.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

from codeclog.vocoder.hift.causal import CausalHiftConfig, build_causal_hift, initialise_causal_hift
from codeclog.vocoder.hift.causal_stream import CausalVocoder
from codeclog.vocoder.hift.config import HiftConfig
from codeclog.vocoder.hift.fixture_weights import initialise_hift
from codeclog.vocoder.hift.layers import fuse_weight_norm
from codeclog.vocoder.hift.noncausal import build_hift
from codeclog.vocoder.hift.noncausal_stream import HiftCache, stream_step


def measure(name: str, windows: int) -> tuple[list[float], list[float]]:
    hift_config = HiftConfig.full() if name == "full" else HiftConfig.tiny()
    causal_config = CausalHiftConfig.full() if name == "full" else CausalHiftConfig.tiny()
    a = build_hift(hift_config)
    initialise_hift(a, 0)
    fuse_weight_norm(a)
    b = build_causal_hift(causal_config)
    initialise_causal_hift(b, 0)
    vocoder = CausalVocoder(b)
    generator = torch.Generator().manual_seed(0)
    mels = [torch.randn(1, 80, 50, generator=generator) - 5.0 for _ in range(windows + 1)]
    cache_a, cache_b = [HiftCache.empty(hift_config)], [vocoder.empty_cache()]
    times_a: list[float] = []
    times_b: list[float] = []
    with torch.inference_mode():
        for index, mel in enumerate(mels):
            start = time.perf_counter()
            cache_a = stream_step(a, cache_a, mel, False, [index]).caches
            middle = time.perf_counter()
            cache_b = vocoder.step(cache_b, mel, False).caches
            end = time.perf_counter()
            if index:  # the first window warms up
                times_a.append(middle - start)
                times_b.append(end - middle)
    return times_a, times_b


Measure = Callable[[str, int, int], tuple[list[float], list[float]]]


def compare_main(
    doc: str, script: str, title: str, measure: Measure, argv: Sequence[str] | None
) -> int:
    """The A-vs-B table of one-row timings per size, for this bench and bench_engine_hift.py:
    `measure(size, windows, threads)` gives A's and B's seconds per window; `title` is
    formatted with the torch version and the thread count."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
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
    command = f"python -m bench.{script} " + shlex.join(sys.argv[1:] if argv is None else argv)
    heading = title.format(torch=torch.__version__, threads=args.threads)
    print(heading + "\n\n" + "\n".join(lines) + f"\n\nCommand: `{command}`")
    return 0


def _measure_with_threads(name: str, windows: int, threads: int) -> tuple[list[float], list[float]]:
    torch.set_num_threads(threads)
    return measure(name, windows)


def main(argv: Sequence[str] | None = None) -> int:
    title = "Causal HiFT (B) vs HiFT (A), one row, torch {torch}, {threads} thread(s)"
    return compare_main(__doc__ or "", "bench_causal_hift", title, _measure_with_threads, argv)


if __name__ == "__main__":
    sys.exit(main())
