"""Ragged vs exact batching: decode calls per step and windows/s by batch size, side by side.

    python -m bench.bench_ragged                          # tiny fixture, CPU
    python -m bench.bench_ragged --device cuda --spec /path/to/assets/token2wav --streams 100

Part 1: one decode step of `--streams` streams at mixed positions (vocoder.engine.mixed_batch: 0-4
windows decoded before, every fourth window final with 1-27 ids): the flow and HiFT calls the
exact path makes (one per equal-shape group; HiFT per row on CPU) and the ragged path makes (one
per final flag). Part 2: windows/s of one such step at each batch size, per batching mode, and
the ratio to batch 1 (the issue-23 CPU target: ragged batch 16 >= 3x batch 1). Part 3: the
ragged path's bound: `--bound-seeds` x 8 whole streams of mixed lengths decoded side by side,
every window compared with the same stream decoded alone (max LSB, min SNR). Output is
markdown plus the exact command.
"""

from __future__ import annotations

import argparse
import math
import random
import shlex
import sys
import time
from collections.abc import Sequence

from codeclog.consumers.readers.audio_compare import Bound, compare_bound
from codeclog.vocoder.engine import Code2WavEngine
from codeclog.vocoder.engine.mixed_batch import decode_calls, mixed_position_items
from codeclog.vocoder.flow import canonical_windows
from codeclog.vocoder.shared import pcm_s16le


def windows_per_s(engine: Code2WavEngine, batch: int, seconds: float) -> float:
    items = mixed_position_items(engine, batch, seed=batch)
    engine.decode_batch(items)  # warm-up
    started, done = time.perf_counter(), 0
    while done == 0 or time.perf_counter() - started < seconds:
        engine.decode_batch(items)
        done += batch
    return done / (time.perf_counter() - started)


Windows = list[tuple[tuple[int, ...], bool]]


def side_by_side(engine: Code2WavEngine, streams: list[Windows], seeds: list[int]) -> list[list]:
    """Every stream advanced one window per step, all in one decode_batch per step."""
    states = [engine.setup(seed=seed) for seed in seeds]
    audio: list[list] = [[] for _ in streams]
    todo = [[w for w in windows if w[0]] for windows in streams]  # empty finals only end
    position = [0] * len(streams)
    while rows := [s for s in range(len(streams)) if position[s] < len(todo[s])]:
        items = [(states[s], *todo[s][position[s]]) for s in rows]
        for s, (samples, state) in zip(rows, engine.decode_batch(items), strict=True):
            states[s], position[s] = state, position[s] + 1
            audio[s].append(samples)
    return audio


def ragged_bound(
    exact: Code2WavEngine, ragged: Code2WavEngine, seeds: int
) -> tuple[int, float, int]:
    worst_lsb, worst_snr, windows = 0, math.inf, 0
    for seed in range(seeds):
        rng = random.Random(seed)
        streams = [
            canonical_windows(
                [4218] * 3
                + [rng.randrange(6561) for _ in range(rng.choice([10, 30, 40, 60, 90, 130]))]
            )
            for _ in range(8)
        ]
        ids = list(range(len(streams)))
        together = side_by_side(ragged, streams, ids)
        for s, windows_of in enumerate(streams):
            [alone] = side_by_side(exact, [windows_of], [s])
            for want, got in zip(alone, together[s], strict=True):
                verdict = compare_bound(pcm_s16le(want), pcm_s16le(got), Bound())
                worst_lsb = max(worst_lsb, verdict.max_abs_lsb)
                worst_snr = min(worst_snr, verdict.snr_db)
                windows += 1
    return worst_lsb, worst_snr, windows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="tiny", help="tiny or a checkpoint directory")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default="float32", help="flow dtype")
    parser.add_argument("--streams", type=int, default=100, help="streams in the call count")
    parser.add_argument("--batches", default="1,16", help="batch sizes for windows/s")
    parser.add_argument("--seconds", type=float, default=5.0, help="timed seconds per cell")
    parser.add_argument("--workers", type=int, default=1, help="CPU decode workers (exact)")
    parser.add_argument("--bound-seeds", type=int, default=3, help="8-stream sets for part 3")
    args = parser.parse_args(argv)
    engines = {
        mode: Code2WavEngine.from_spec(
            args.spec, device=args.device, dtype=args.dtype, workers=args.workers, batching=mode
        )
        for mode in ("exact", "ragged")
    }
    items = mixed_position_items(engines["ragged"], args.streams)
    print(f"## Decode calls for one step of {args.streams} streams at mixed positions\n")
    print("| batching | flow calls | HiFT calls |\n|---|---:|---:|")
    for mode, engine in engines.items():
        calls = decode_calls(engine, items)
        print(f"| {mode} | {calls.flow} | {calls.hift} |")
    batches = [int(b) for b in args.batches.split(",")]
    print("\n## Windows/s of one mixed-position step\n")
    print("| batching | " + " | ".join(f"B={b}" for b in batches) + " | ratio B_max/B_1 |")
    print("|---|" + "---:|" * (len(batches) + 1))
    for mode, engine in engines.items():
        rates = [windows_per_s(engine, b, args.seconds) for b in batches]
        cells = " | ".join(f"{r:.2f}" for r in rates)
        print(f"| {mode} | {cells} | {rates[-1] / rates[0]:.2f}x |")
    if args.bound_seeds > 0:
        lsb, snr, count = ragged_bound(engines["exact"], engines["ragged"], args.bound_seeds)
        print(f"\n## Ragged vs solo audio, {count} windows\n")
        print(f"| max abs LSB | min SNR dB |\n|---:|---:|\n| {lsb} | {snr:.1f} |")
    print(f"\ncommand: python -m bench.bench_ragged {shlex.join(argv or sys.argv[1:])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
