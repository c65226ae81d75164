"""Talker publisher: chunks/s and produce-to-ack latency at linger.ms 0, 1 and 5, one run.

For each linger value, on a fresh topic of the same cluster:
- burst: `--records` realistic codec chunks (28-id windows of 64 interleaved requests, made by
  the real windowing) published as fast as `ChunkPublisher.publish` takes them, Avro encoding
  included; reports chunks/s (publish start to the last ack) and ack latency p50/p99 under
  that load;
- paced: `--rate` chunks/s for `--paced-seconds` (a live load: one chunk per second per
  stream, so --rate 200 is 200 concurrent talker streams); reports ack latency p50/p99.

Produce-to-ack latency is measured per record from `produce()` to its delivery report
(acks=all, idempotent). It starts its own LocalBroker in a temp dir unless --bootstrap is
given. Prints a Markdown table and the exact command.

Run: python -m bench.bench_publisher [--bootstrap HOST:PORT] [--records 20000] [--rate 200]
"""

from __future__ import annotations

import argparse
import platform
import random
import shlex
import sys
import time
import uuid
from collections.abc import Sequence

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic

from bench.local_broker import cluster
from codeclog.producers.publisher import ChunkPublisher, PublisherConfig
from codeclog.producers.windowing import StepInput, initial_state, step
from codeclog.schemas.records import CODEC_VOCAB, CodecChunk

LINGERS_MS = (0.0, 1.0, 5.0)
REQUESTS = 64
PARTITIONS = 8


def realistic_chunks(count: int, seed: int) -> list[CodecChunk]:
    """`count` steady-state windows from REQUESTS interleaved talker streams."""
    rng = random.Random(seed)
    states = [initial_state(f"bench-{i:03d}", producer_id="bench") for i in range(REQUESTS)]
    chunks: list[CodecChunk] = []
    while len(chunks) < count:
        index = rng.randrange(REQUESTS)
        ids = tuple(rng.randrange(CODEC_VOCAB) for _ in range(25))
        text = "unit text · 单元".encode()
        step_input = StepInput(states[index].request_id, codec_ids=ids, text_utf8=text)
        states[index], out = step(states[index], step_input)
        chunks.extend(out)
    return chunks[:count]


def create_topic(bootstrap: str, prefix: str) -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    deadline = time.monotonic() + 30
    while topic not in admin.list_topics(timeout=10).topics:
        if time.monotonic() > deadline:
            raise SystemExit(f"topic {topic} did not become visible")
        time.sleep(0.1)
    return topic


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def burst(bootstrap: str, linger_ms: float, chunks: list[CodecChunk]) -> tuple[float, float, float]:
    topic = create_topic(bootstrap, "bench-burst")
    config = PublisherConfig(topic, linger_ms=linger_ms, backpressure_timeout_s=60)
    publisher = ChunkPublisher({"bootstrap.servers": bootstrap}, config)
    warm(publisher, chunks)
    start = time.perf_counter()
    for chunk in chunks:
        publisher.publish(chunk)
    report = publisher.close(120)
    elapsed = time.perf_counter() - start
    check(report.failed, report.undelivered)
    latencies = publisher.stats.latency_ms[-len(chunks) :]
    return len(chunks) / elapsed, percentile(latencies, 0.5), percentile(latencies, 0.99)


def paced(
    bootstrap: str, linger_ms: float, chunks: list[CodecChunk], rate: float, seconds: float
) -> tuple[float, float]:
    topic = create_topic(bootstrap, "bench-paced")
    config = PublisherConfig(topic, linger_ms=linger_ms)
    publisher = ChunkPublisher({"bootstrap.servers": bootstrap}, config)
    warm(publisher, chunks)
    count = int(rate * seconds)
    start = time.perf_counter()
    for index in range(count):
        delay = start + index / rate - time.perf_counter()
        if delay > 0:
            publisher.poll(delay)  # wait by serving delivery reports, as a live talker would
        publisher.publish(chunks[index % len(chunks)])
    report = publisher.close(60)
    check(report.failed, report.undelivered)
    latencies = publisher.stats.latency_ms[-count:]
    return percentile(latencies, 0.5), percentile(latencies, 0.99)


def warm(publisher: ChunkPublisher, chunks: list[CodecChunk]) -> None:
    """Connect and learn the partition leaders before the clock starts."""
    for chunk in chunks[: PARTITIONS * 4]:
        publisher.publish(chunk)
    if publisher.flush(30):
        raise SystemExit("warm-up records were not acknowledged within 30 s")


def client_version() -> str:
    version = confluent_kafka.version()
    return str(version[0] if isinstance(version, tuple) else version)


def check(failed: int, undelivered: int) -> None:
    if failed or undelivered:
        raise SystemExit(f"{failed} records failed ({undelivered} undelivered): not a valid run")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--bootstrap", help="use this cluster instead of a local broker")
    parser.add_argument("--records", type=int, default=20_000, help="records per burst run")
    parser.add_argument("--rate", type=float, default=200.0, help="paced chunks/s")
    parser.add_argument("--paced-seconds", type=float, default=5.0, help="paced run length")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    chunks = realistic_chunks(args.records, args.seed)
    rows = []
    with cluster(args.bootstrap) as bootstrap:
        for linger_ms in LINGERS_MS:
            print(f"linger.ms={linger_ms:g}: burst, then paced ...", file=sys.stderr)
            rate, b50, b99 = burst(bootstrap, linger_ms, chunks)
            p50, p99 = paced(bootstrap, linger_ms, chunks, args.rate, args.paced_seconds)
            rows.append((linger_ms, rate, b50, b99, p50, p99))
    print_table(rows, args, chunks)
    return 0


def print_table(
    rows: Sequence[tuple[float, ...]], args: argparse.Namespace, chunks: list[CodecChunk]
) -> None:
    print(
        f"| linger.ms | burst chunks/s | burst ack p50 ms | burst ack p99 ms "
        f"| paced ({args.rate:g}/s) ack p50 ms | paced ack p99 ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for linger_ms, rate, b50, b99, p50, p99 in rows:
        print(f"| {linger_ms:g} | {rate:,.0f} | {b50:.2f} | {b99:.2f} | {p50:.2f} | {p99:.2f} |")
    print()
    where = args.bootstrap or "a LocalBroker (Kafka 4.3.1, one node) started by the bench"
    print(
        f"{len(chunks):,} chunks of 28 codec ids per burst, {REQUESTS} request keys, "
        f"{PARTITIONS} partitions, acks=all, idempotent, no compression; cluster: {where}; "
        f"{platform.python_implementation()} {platform.python_version()}, confluent-kafka "
        f"{client_version()} / librdkafka {confluent_kafka.libversion()[0]}, "
        f"{platform.machine()}."
    )
    print(f"command: python -m bench.bench_publisher {shlex.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    sys.exit(main())
