"""What the portable kernels cost: RTF of native vs portable decoding, side by side in one run.

    python -m bench.bench_kernels                       # tiny fixture, 3 windows, 5 rounds
    python -m bench.bench_kernels --spec full --windows 1 --rounds 1   # published sizes (slow)

Each round decodes the same stream (MiniCPM-o's 25 + 3 windows, 3 silence ids first) once per
configuration, the configurations taking turns so that drift of a shared machine hits all of
them alike; each configuration keeps its fastest round. Configurations: native kernels, portable
kernels with the exact products on float64 BLAS, and on int64 loops (the two give identical
bytes; the process picks the faster one, under CPU emulation the int64 loops). Prompt setup is
excluded. Prints a markdown table (RTF = decode wall time / audio time, ratio to native), the
bytes' SHA-256 per configuration, and the exact command.
"""

from __future__ import annotations

import argparse
import hashlib
import shlex
import sys
import time

from bench.bench_vocoder import build_engine, schedule
from codeclog.vocoder.engine import Code2WavEngine, pcm_s16le
from codeclog.vocoder.kernels.products import IntegerProducts

SAMPLE_RATE = 24000
CONFIGS = ("native", "portable/float64", "portable/int64")


def _engine(spec: str, config: str, threads: int) -> Code2WavEngine:
    kernels, _, gemm = config.partition("/")
    engine = build_engine(spec, "cpu", "float32", threads, workers=1, kernels=kernels)
    if gemm:
        from codeclog.vocoder.kernels import products

        products._DEFAULT_GEMM = IntegerProducts(gemm)  # the process-wide choice, forced
        engine = build_engine(spec, "cpu", "float32", threads, workers=1, kernels=kernels)
    return engine


def _decode(engine: Code2WavEngine, windows: int) -> tuple[float, float, str]:
    state = engine.setup(seed=1)
    pcm = b""
    start = time.perf_counter()
    for ids, final in schedule(0, windows):
        [(audio, state)] = engine.decode_batch([(state, ids, final)])
        pcm += pcm_s16le(audio)
    wall = time.perf_counter() - start
    return wall, len(pcm) / 2 / SAMPLE_RATE, hashlib.sha256(pcm).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="tiny", help="tiny (default), full, or a checkpoint")
    parser.add_argument("--windows", type=int, default=3, help="windows per stream")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (fastest kept)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"comma-separated subset of {', '.join(CONFIGS)} (native is always included)",
    )
    args = parser.parse_args(argv)
    configs = ["native", *(c for c in args.configs.split(",") if c in CONFIGS and c != "native")]
    best: dict[str, float] = {}
    audio: dict[str, float] = {}
    digests: dict[str, str] = {}
    for _ in range(args.rounds):
        for config in configs:
            engine = _engine(args.spec, config, args.threads)
            _decode(engine, 1)  # warm-up (weight quantization, first calls)
            wall, seconds, digest = _decode(engine, args.windows)
            best[config] = min(best.get(config, wall), wall)
            audio[config], digests[config] = seconds, digest
    native_rtf = best["native"] / audio["native"]
    print("| kernels | RTF | x native | sha256 of the PCM |\n|---|---|---|---|")
    for config in configs:
        rtf = best[config] / audio[config]
        print(f"| {config} | {rtf:.3f} | {rtf / native_rtf:.2f} | `{digests[config][:12]}` |")
    portable_digests = {digests[c] for c in configs if c.startswith("portable")}
    same = len(portable_digests) <= 1
    print(f"\nthe portable configurations give identical bytes: {same}")
    print(f"command: python -m bench.bench_kernels {shlex.join(sys.argv[1:])}".rstrip())
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
