"""What one exactly-once step costs the broker round trips, phase by phase (issue 8).

Every step of `codeclog vocode` is one Kafka transaction: begin, produce the audio (here one
48 KB record, a second of 16-bit PCM at 24 kHz), `send_offsets_to_transaction` (AddOffsetsToTxn,
then TxnOffsetCommit to the group coordinator) and `commit_transaction` (the produce's
AddPartitionsToTxn and ProduceRequest must finish first, then EndTxn). A chunk that arrives
while a step runs waits for the rest of that step and for its own, so this cost bounds the
latency the Kafka path adds. Measured on the local broker (or --bootstrap), with steps spaced as
a live service spaces them (--gap-ms, default 30) and back to back (gap 0).

    python -m bench.bench_transaction
    python -m bench.bench_transaction --steps 500 --gap-ms 10
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import uuid

import numpy as np

from bench.local_broker import cluster

PHASES = ("begin", "produce", "send_offsets", "commit", "whole step")
AUDIO_BYTES = 48_000  # one second of 16-bit PCM at 24 kHz


def measure(
    bootstrap: str, steps: int, gap_s: float, warm_s: float = 0.0
) -> dict[str, list[float]]:
    """Phase times (ms) of `steps` steps `gap_s` apart, after `warm_s` seconds of unmeasured
    back-to-back steps (a fresh broker's JIT has not compiled its request paths yet: measured,
    a whole step p50 17 ms on a fresh broker against 5 ms on a warm one)."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    run = uuid.uuid4().hex[:8]
    source, sink = f"txn-bench-{run}-in", f"txn-bench-{run}-out"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(source, 1, 1), NewTopic(sink, 1, 1)]).values():
        future.result()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"txn-bench-{run}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(source, 0, 0)])
    from codeclog.consumers.member.producer_config import transactional_producer_config

    client = {"bootstrap.servers": bootstrap}
    producer = Producer(transactional_producer_config(client, f"txn-bench-{run}", 60_000))
    producer.init_transactions(30)
    value = bytes(AUDIO_BYTES)
    times: dict[str, list[float]] = {phase: [] for phase in PHASES}
    group = consumer.consumer_group_metadata()

    def step(offset: int) -> list[float]:
        marks = [time.perf_counter()]
        producer.begin_transaction()
        marks.append(time.perf_counter())
        producer.produce(sink, value, key=b"request")
        marks.append(time.perf_counter())
        producer.send_offsets_to_transaction([TopicPartition(source, 0, offset)], group, 30)
        marks.append(time.perf_counter())
        producer.commit_transaction(30)
        marks.append(time.perf_counter())
        return marks

    warm_until = time.monotonic() + warm_s
    warmed = 0
    while time.monotonic() < warm_until or warmed < 20:  # the first 20 load the coordinators
        step(warmed)
        warmed += 1
    for offset in range(warmed, warmed + steps):
        time.sleep(gap_s)
        marks = step(offset)
        spans = [b - a for a, b in itertools.pairwise(marks)] + [marks[-1] - marks[0]]
        for phase, span in zip(PHASES, spans, strict=True):
            times[phase].append(span * 1000)
    consumer.close()
    return times


def print_table(rows: list[tuple[float, dict[str, list[float]]]]) -> None:
    print("| steps spaced by | " + " | ".join(f"{p} p50 / p99 ms" for p in PHASES) + " |")
    print("|---:|" + "---:|" * len(PHASES))
    for gap_ms, times in rows:
        cells = [
            f"{np.percentile(times[p], 50):.1f} / {np.percentile(times[p], 99):.1f}" for p in PHASES
        ]
        print(f"| {gap_ms:g} ms | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", help="an existing cluster (default: start a local broker)")
    parser.add_argument("--steps", type=int, default=200, help="measured steps per row")
    parser.add_argument("--gap-ms", type=float, default=30.0, help="pause between steps")
    parser.add_argument(
        "--warm-s", type=float, default=20.0, help="unmeasured back-to-back steps first (seconds)"
    )
    args = parser.parse_args(argv)
    with cluster(args.bootstrap) as bootstrap:
        rows = [
            (gap, measure(bootstrap, args.steps, gap / 1000, args.warm_s if first else 0.0))
            for first, gap in ((True, args.gap_ms), (False, 0.0))
        ]
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
