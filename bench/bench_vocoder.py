"""End-to-end Code2Wav throughput: RTF per stream and real-time streams, at several batch sizes.

    python -m bench.bench_vocoder                                   # tiny fixture, CPU, B=1,4,16
    python -m bench.bench_vocoder --spec full --windows 1 --batches 1,4   # published sizes, CPU
    python -m bench.bench_vocoder --spec /path/to/assets/token2wav --device cuda

Each run decodes B streams side by side (one decode_batch call per window position, MiniCPM-o's
25 + 3 windows, 3 silence ids first), after one untimed warm-up window. Per batch size it
reports the wall time of the decode calls, the audio each stream got, the RTF per stream
(wall / audio of one stream: every stream waits for the whole batch) and the real-time streams
(B x audio / wall: how many streams this batch size would sustain in real time). Prompt setup
is excluded (it is cached per voice). `--spec full` uses random weights at the published sizes
(no checkpoint needed). Output is a markdown table plus the exact command.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from codeclog.vocoder.engine import Code2WavEngine
from codeclog.vocoder.flow import FlowConfig, Token2WavFlow, canonical_windows
from codeclog.vocoder.hift.config import HiftConfig
from codeclog.vocoder.hift.fixture_weights import initialise_hift
from codeclog.vocoder.hift.noncausal import HiFTGenerator, build_hift

SILENCE = 4218


@dataclasses.dataclass(frozen=True)
class Row:
    batch: int
    windows: int
    wall_s: float
    audio_s: float  # per stream
    first_window_s: float

    @property
    def rtf(self) -> float:
        return self.wall_s / self.audio_s

    @property
    def realtime_streams(self) -> float:
        return self.batch * self.audio_s / self.wall_s


def build_engine(
    spec: str,
    device: str,
    dtype: str,
    threads: int | None,
    workers: int | None = None,
    kernels: str = "native",
) -> Code2WavEngine:
    if spec != "full":
        return Code2WavEngine.from_spec(
            spec, device=device, dtype=dtype, threads=threads, workers=workers, kernels=kernels
        )
    flow, hift = published_random_weights()
    return Code2WavEngine(
        flow,
        hift,
        device=device,
        dtype=dtype,
        threads=threads,
        workers=workers,
        spec="full",
        kernels=kernels,
    )


def published_random_weights() -> tuple[Token2WavFlow, HiFTGenerator]:
    """A flow and a HiFT at the published sizes with seeded random weights (no checkpoint
    needed; every run builds the same numbers)."""
    hift = build_hift(HiftConfig.full())
    initialise_hift(hift, 0)
    return Token2WavFlow(FlowConfig.full()), hift


def stream_ids(index: int, windows: int) -> list[int]:
    """Ids for `windows` canonical windows: windows-1 full ones and a final one of 13."""
    count = 3 + 25 * (windows - 1) + 10 if windows > 1 else 28
    return [SILENCE] * 3 + [(i * 7919 + 13 * index) % 6561 for i in range(count - 3)]


def schedule(index: int, windows: int) -> list[tuple[tuple[int, ...], bool]]:
    if windows == 1:  # one non-final 25+3 window: the steady-state cost of a chunk
        return [(tuple(stream_ids(index, 1)), False)]
    return canonical_windows(stream_ids(index, windows))


def run_batch(engine: Code2WavEngine, batch: int, windows: int) -> Row:
    plans = [schedule(i, windows) for i in range(batch)]
    states = [engine.setup(seed=i) for i in range(batch)]
    samples = 0
    first = 0.0
    start = time.perf_counter()
    for position in range(len(plans[0])):
        items = [(states[i], *plans[i][position]) for i in range(batch)]
        results = engine.decode_batch(items)
        if position == 0:
            first = time.perf_counter() - start
        states = [state for _, state in results]
        samples += len(results[0][0])
        print(f"  batch {batch}: window {position + 1}/{len(plans[0])}", file=sys.stderr)
    wall = time.perf_counter() - start
    return Row(batch, len(plans[0]), wall, samples / engine.sample_rate_hz, first)


def table(rows: Sequence[Row]) -> str:
    lines = [
        "| batch | windows | wall s | audio s / stream | RTF / stream | real-time streams "
        "| first window s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.batch} | {r.windows} | {r.wall_s:.3f} | {r.audio_s:.3f} | {r.rtf:.3f} "
            f"| {r.realtime_streams:.2f} | {r.first_window_s:.3f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", default="tiny", help="tiny | full | a checkpoint directory")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default="float32", help="flow dtype: float32|float16|bfloat16")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default 1)")
    parser.add_argument(
        "--workers", type=int, default=None, help="decode workers (default: cores, up to 4)"
    )
    parser.add_argument("--batches", default="1,4,16", help="comma-separated batch sizes")
    parser.add_argument("--windows", type=int, default=3, help="windows per stream (1 = one chunk)")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",") if b]
    if args.windows < 1 or not batches or min(batches) < 1:
        print("--windows and every batch size must be >= 1", file=sys.stderr)
        return 2
    engine = build_engine(args.spec, args.device, args.dtype, args.threads, args.workers)
    run_batch(engine, 1, 1)  # warm-up: first-call allocations and kernel selection
    rows = [run_batch(engine, batch, args.windows) for batch in batches]
    info = engine.describe()
    command = "python -m bench.bench_vocoder " + shlex.join(sys.argv[1:] if argv is None else argv)
    report = "\n".join(
        [
            f"Code2Wav end-to-end, spec `{args.spec}`, device `{info['device']}`, flow dtype "
            f"`{info['dtype']}`, torch {info['torch']}, CPU threads "
            f"{engine.determinism.threads}, decode workers {info['workers']}, "
            f"batch-invariant {info['batch_invariant']}.",
            "",
            table(rows),
            "",
            f"Command: `{command.strip()}`",
        ]
    )
    print(report)
    if args.out is not None:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
