"""Benchmark of the Code2Wav consumer (issue 8), measured side by side in one run.

1. Decode batching: windows/s of `Code2WavEngine.decode_batch` at batch 1, 4 and 16 on the tiny
   model (16 distinct streams, steady 28-id windows). Target: >= 3x from batch 1 to 16.
2. The latency the Kafka path adds per chunk: N live (real-time) synthetic duplex streams through
   the real broker and the real consumer service. For every audio window: end-to-end =
   commit time of its transaction - produced_at of its newest chunk; the vocoder's own share is
   the decode time of its step (what calling the vocoder in-process on the same windows costs);
   added = end-to-end - decode. Target: added p99 <= 20 ms at 100 streams.

    python bench/bench_consumer.py                      # starts its own broker
    python bench/bench_consumer.py --bootstrap 127.0.0.1:9092 --streams 100 --seconds 20
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def batching(engine: Any, batches: list[int], reps: int) -> dict[int, float]:
    """Windows per second of decode_batch at each batch size."""
    ids = [4218] * 3 + list(range(100, 125))
    rates: dict[int, float] = {}
    for size in batches:
        states = [engine.setup(seed=i) for i in range(size)]
        states = [r[1] for r in engine.decode_batch([(s, ids, False) for s in states])]
        started = time.perf_counter()
        for rep in range(reps):
            window = list(range(122 + rep, 150 + rep))
            results = engine.decode_batch([(s, window, False) for s in states])
            states = [r[1] for r in results]
        rates[size] = size * reps / (time.perf_counter() - started)
    return rates


@dataclasses.dataclass
class StepRecord:
    committed_at: float
    decode_s: float
    produced_at_ms: list[int]
    windows: int


def kafka_path(bootstrap: str, engine: Any, streams: int, seconds: float) -> dict[str, Any]:
    from codeclog.config import TopicsConfig
    from codeclog.topics import ensure_topics
    from consumers.pipeline import StepOutput
    from consumers.service import VocodeConfig, VocoderService
    from producers.publisher import ChunkPublisher, PublisherConfig, Talker, wall_clock_ms
    from producers.synthetic import SyntheticConfig, merged, play, scripts

    run = uuid.uuid4().hex[:8]
    topics = TopicsConfig(
        chunks=f"bench-{run}-chunks",
        audio=f"bench-{run}-audio",
        dlq=f"bench-{run}-dlq",
        progress=f"bench-{run}-progress",
        partitions=8,
    )
    client = {"bootstrap.servers": bootstrap}
    ensure_topics(client, topics)
    steps: list[StepRecord] = []

    class Instrumented(VocoderService):
        def _observe(self, out: StepOutput, step_s: float) -> None:
            produced = [c.source_produced_at_ms for c in out.audio if c.source_produced_at_ms]
            steps.append(StepRecord(time.time(), out.decode_s, produced, len(out.audio)))
            super()._observe(out, step_s)

    stop = threading.Event()
    config = VocodeConfig(group=f"bench-{run}", instance_id="bench", max_records=128, max_batch=128)
    service = Instrumented(client, topics, config, engine, stop_event=stop)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    time.sleep(3.0)  # join the group before the talker starts
    publisher = ChunkPublisher(client, PublisherConfig(topic=topics.chunks, producer_id="bench"))
    talker = Talker(publisher, producer_id="bench", native_duplex=True)
    synthetic = SyntheticConfig(sessions=streams, seconds=seconds, seed=1)
    started = time.monotonic()
    play(
        merged(scripts(synthetic)),
        talker.apply,
        total_s=seconds,
        realtime=True,
        clock=time.monotonic,
        sleep=time.sleep,
        now_ms=wall_clock_ms,
    )
    publisher.close(30)
    talk_s = time.monotonic() - started
    deadline = time.monotonic() + 120
    last = -1
    while time.monotonic() < deadline:  # drained: no new windows for 3 s
        time.sleep(3.0)
        count = sum(s.windows for s in steps)
        if count == last:
            break
        last = count
    stop.set()
    thread.join(30)
    end_to_end, decode, added = [], [], []
    for step in steps:
        for produced_ms in step.produced_at_ms:
            e2e = step.committed_at - produced_ms / 1000
            end_to_end.append(e2e)
            decode.append(step.decode_s)
            added.append(e2e - step.decode_s)
    windows = sum(s.windows for s in steps)
    return {
        "streams": streams,
        "seconds": seconds,
        "windows": windows,
        "windows_per_s": windows / talk_s if talk_s else 0.0,
        "needed_windows_per_s": streams * 1.0,
        "e2e_p50_ms": _percentile(end_to_end, 50) * 1000,
        "e2e_p99_ms": _percentile(end_to_end, 99) * 1000,
        "decode_p50_ms": _percentile(decode, 50) * 1000,
        "decode_p99_ms": _percentile(decode, 99) * 1000,
        "added_p50_ms": _percentile(added, 50) * 1000,
        "added_p99_ms": _percentile(added, 99) * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--bootstrap", help="an existing cluster (default: start a local broker)")
    parser.add_argument("--streams", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--skip-kafka", action="store_true")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(2)
    from vocoder.engine import Code2WavEngine

    engine = Code2WavEngine.from_spec("tiny")
    rates = batching(engine, args.batches, args.reps)
    print("| batch | windows/s (tiny, CPU) | vs batch 1 |")
    print("|---:|---:|---:|")
    for size, rate in rates.items():
        print(f"| {size} | {rate:.1f} | {rate / rates[args.batches[0]]:.2f}x |")
    if args.skip_kafka:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        bootstrap = args.bootstrap
        broker = None
        if bootstrap is None:
            from codeclog.broker import LocalBroker

            broker = LocalBroker(Path(tmp) / "broker")
            bootstrap = broker.start().bootstrap
        try:
            print()
            print(
                "| streams | windows/s needed | windows/s done | e2e p50 / p99 ms "
                "| decode (in-process) p50 / p99 ms | added by Kafka p50 / p99 ms |"
            )
            print("|---:|---:|---:|---:|---:|---:|")
            for streams in args.streams:
                r = kafka_path(bootstrap, engine, streams, args.seconds)
                print(
                    f"| {streams} | {r['needed_windows_per_s']:.0f} | {r['windows_per_s']:.1f} "
                    f"| {r['e2e_p50_ms']:.0f} / {r['e2e_p99_ms']:.0f} "
                    f"| {r['decode_p50_ms']:.0f} / {r['decode_p99_ms']:.0f} "
                    f"| {r['added_p50_ms']:.0f} / {r['added_p99_ms']:.0f} |",
                    flush=True,
                )
        finally:
            if broker is not None:
                broker.stop()
    print(f"\ncommand: python bench/bench_consumer.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
