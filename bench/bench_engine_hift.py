"""CPU cost per row of the streaming engine with the causal HiFT (`--hift causal`, scheme B)
against the default non-causal HiFT (scheme A): whole windows, flow included.

    python -m bench.bench_engine_hift                      # tiny and full sizes, 1 thread
    python -m bench.bench_engine_hift --configs tiny --windows 12

Two engines of the same flow weights (tiny: the committed fixture and the seeded causal
fixture; full: seeded random weights at the published sizes) decode one row (batch 1) of
canonical 28-id windows (25 new codec frames, 1.0 s of audio each) after one untimed warm-up
window; A and B take turns window by window, so a shared machine's load hits both alike. The
engine's decode runs the flow then the HiFT; the flow's share is the same for both, so B / A
here is below the vocoder-only ratio of bench.bench_causal_hift. Native kernels, 1 worker.
Prints best and mean seconds per window, the RTF (best s per 1.0 s window) and B / A.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from bench.bench_causal_hift import compare_main
from codeclog.vocoder.engine import Code2WavEngine
from codeclog.vocoder.engine.options import EngineOptions
from codeclog.vocoder.flow import FlowConfig, Token2WavFlow
from codeclog.vocoder.hift.causal import (
    CausalHiftConfig,
    build_causal_hift,
    initialise_causal_hift,
)
from codeclog.vocoder.hift.config import HiftConfig
from codeclog.vocoder.hift.fixture_weights import initialise_hift
from codeclog.vocoder.hift.noncausal import build_hift

SILENCE = 4218


def engines(name: str, threads: int) -> tuple[Code2WavEngine, Code2WavEngine]:
    options: EngineOptions = {"kernels": "native", "workers": 1, "threads": threads}
    if name == "tiny":
        return Code2WavEngine.tiny(**options), Code2WavEngine.tiny(hift="causal", **options)
    hift = build_hift(HiftConfig.full())
    initialise_hift(hift, 0)
    causal = build_causal_hift(CausalHiftConfig.full())
    initialise_causal_hift(causal, 0)
    # the flow is seeded by FlowConfig.init_seed: both engines get the same weights
    a = Code2WavEngine(Token2WavFlow(FlowConfig.full()), hift, spec="full", **options)
    b = Code2WavEngine(Token2WavFlow(FlowConfig.full()), causal, spec="full", **options)
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
    title = (
        "Engine, one row: --hift causal (B) vs noncausal (A), flow + HiFT per window, "
        "torch {torch}, {threads} thread(s)"
    )
    return compare_main(__doc__ or "", "bench_engine_hift", title, measure, argv)


if __name__ == "__main__":
    sys.exit(main())
