"""The floor under issue 22's target: produced_at -> visible to a speculative listener, with no
fold and no decode at all, for each way a relay can write (issue 22).

Three processes, as in `bench_consumer.py`: a talker writes 25 small chunk records a second per
stream (each carrying its wall-clock produced_at and its sequence number); a relay in this
process reads them (read_committed, a consumer-group member, as the service) and, for every
25th chunk of a stream, writes one 48 KB audio record (a second of 16-bit PCM) carrying that
chunk's produced_at; a speculative listener (read_uncommitted, in its own process) reads the
audio and records now - produced_at. The relay does nothing else, so each row is what the
hand-off costs on this machine whatever the consumer's design (`codeclog vocode` itself, with
its transaction per step, is measured by `bench_consumer.py`):

- plain: an idempotent producer, no transaction (no exactly-once: the floor of any design);
- cadenced: one transaction open across poll batches, committed every --commit-ms on the
  relay's thread (a produce waits while it commits);
- alternating: two transactional producers; batches go into one while the other commits, every
  --commit-ms (the shape of a pipelined consumer whose steps never wait for a commit).

    python -m bench.bench_listener_floor
    python -m bench.bench_listener_floor --streams 2 100 --seconds 15 --modes plain alternating
"""

from __future__ import annotations

import argparse
import multiprocessing
import struct
import sys
import threading
import time
import uuid
from typing import Any

import numpy as np

from bench.local_broker import cluster

MODES = ("plain", "cadenced", "alternating")
CHUNKS_PER_S = 25
AUDIO_PAD = b"\0" * 48_000
TARGET_P99_MS = 15.0
CHUNK = struct.Struct("<dI")  # produced_at (s, wall clock), sequence number of the stream


def talker(bootstrap: str, topic: str, streams: int, until: float) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    sent, started = 0, time.monotonic()
    while time.monotonic() < until:
        due = int((time.monotonic() - started) * CHUNKS_PER_S * streams)
        for n in range(sent, due):
            value = CHUNK.pack(time.time(), n // streams) + b"\0" * 100
            producer.produce(topic, key=str(n % streams).encode(), value=value)
        sent = due
        producer.poll(0)
        time.sleep(0.001)
    producer.flush(10)


def listener(
    bootstrap: str, topic: str, warm_s: float, seconds: float, out: Any, ready: Any
) -> None:
    """Join the group, say so (`ready`: the talker starts then), then count the records whose
    produced_at is past the warm-up, for `seconds` more (and 2 s to read the last): for each,
    its latency and the part of it before the relay's produce() (the record's timestamp), ms."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"floor-listener-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_uncommitted",
            "fetch.wait.max.ms": 50,  # as codeclog.consumers.readers.listener
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    while not consumer.assignment():
        consumer.consume(1, 0.05)
    ready.set()
    counted_from, until = time.time() + warm_s, time.monotonic() + warm_s + seconds + 2
    latencies: list[tuple[float, float]] = []
    while time.monotonic() < until:
        messages = consumer.consume(1, 0.05)  # the first record, then what is there: no wait
        messages += consumer.consume(500, 0) if messages else []
        now = time.time()
        for m in messages:
            produced_at = CHUNK.unpack_from(m.value() or b"")[0] if m.error() is None else 0.0
            if produced_at > counted_from:
                written_ms = m.timestamp()[1]
                latencies.append(((now - produced_at) * 1000, written_ms - produced_at * 1000))
    consumer.close()
    out.put(latencies)


class Relay:
    """Reads chunks, writes an audio record per 25th chunk of a stream, in one of MODES."""

    def __init__(self, bootstrap: str, chunks: str, audio: str, mode: str, commit_s: float):
        from confluent_kafka import Consumer, Producer

        self.audio, self.mode, self.commit_s = audio, mode, commit_s
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"floor-relay-{uuid.uuid4().hex}",
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        self.consumer.subscribe([chunks])
        base = {"bootstrap.servers": bootstrap, "linger.ms": 1, "retry.backoff.ms": 1}
        if mode == "plain":
            self.producers = [Producer({**base, "enable.idempotence": True})]
        else:
            count = 2 if mode == "alternating" else 1
            self.producers = [
                Producer({**base, "transactional.id": f"floor-{uuid.uuid4().hex}"})
                for _ in range(count)
            ]
            for producer in self.producers:
                producer.init_transactions(30)
        while not self.consumer.assignment():  # joined before the talker starts
            self.consumer.consume(1, 0.05)
        self.current = 0
        self.open = False  # a transaction of the current producer is open
        self.last_commit = time.monotonic()
        self.committing: threading.Thread | None = None

    def run(self, until: float) -> None:
        while time.monotonic() < until:
            messages = self.consumer.consume(1, 0.01)
            messages += self.consumer.consume(1000, 0) if messages else []
            values = [(m.key() or b"", m.value() or b"") for m in messages if m.error() is None]
            audio = [
                (key, value[:8])
                for key, value in values
                if CHUNK.unpack_from(value)[1] % CHUNKS_PER_S == 24
            ]
            if messages:
                self.write(audio)
            self.producers[self.current].poll(0)
        self.wait_commit()
        if self.open:
            self.producers[self.current].commit_transaction(30)

    def write(self, audio: list[tuple[bytes, bytes]]) -> None:
        producer = self.producers[self.current]
        if self.mode != "plain" and not self.open:
            producer.begin_transaction()
            self.open = True
        for key, produced_at in audio:
            producer.produce(self.audio, key=key, value=produced_at + AUDIO_PAD)
        if self.mode == "plain":
            return
        if time.monotonic() - self.last_commit >= self.commit_s:
            self.send_offsets(producer)
            self.commit()

    def send_offsets(self, producer: Any) -> None:
        positions = self.consumer.position(self.consumer.assignment())
        producer.send_offsets_to_transaction(positions, self.consumer.consumer_group_metadata())

    def commit(self) -> None:
        producer = self.producers[self.current]
        self.open = False
        self.last_commit = time.monotonic()
        if self.mode == "cadenced":
            producer.commit_transaction(30)
            return
        self.wait_commit()  # alternating: the other producer's commit, if still running
        self.committing = threading.Thread(target=producer.commit_transaction, args=(30,))
        self.committing.start()
        self.current = 1 - self.current

    def wait_commit(self) -> None:
        if self.committing is not None:
            self.committing.join()
            self.committing = None

    def close(self) -> None:
        for producer in self.producers:
            producer.flush(10)
        self.consumer.close()


def measure(bootstrap: str, streams: int, mode: str, seconds: float, commit_s: float) -> np.ndarray:
    """Each window's latency, ms."""
    return measure_hops(bootstrap, streams, mode, seconds, commit_s)[:, 0]


def measure_hops(
    bootstrap: str, streams: int, mode: str, seconds: float, commit_s: float
) -> np.ndarray:
    """Each window's latency and the part of it before the relay's produce(), ms (n x 2)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    run = uuid.uuid4().hex[:8]
    chunks, audio = f"floor-chunks-{run}", f"floor-audio-{run}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, 8, 1) for t in (chunks, audio)]).values():
        future.result(30)
    # The relay and the listener join their groups before the talker starts: on a loaded box a
    # join later than the warm-up counted a backlog as latency (seconds in a first row).
    relay = Relay(bootstrap, chunks, audio, mode, commit_s)
    warm_s = 5.0  # first fetches and the broker's JIT: not counted
    ctx = multiprocessing.get_context("spawn")
    out, ready = ctx.Queue(), ctx.Event()
    first = ctx.Process(target=listener, args=(bootstrap, audio, warm_s, seconds, out, ready))
    first.start()
    if not ready.wait(60):
        raise RuntimeError("the floor's listener did not join its group within 60 s")
    until = time.monotonic() + warm_s + seconds
    processes = [first, ctx.Process(target=talker, args=(bootstrap, chunks, streams, until))]
    processes[1].start()
    try:
        relay.run(until)
        latencies = np.asarray(out.get(timeout=60), dtype=np.float64).reshape(-1, 2)
    finally:
        relay.close()
        for process in processes:
            process.join(30)
    return latencies


def row(streams: int, mode: str, ms: np.ndarray) -> str:
    if ms.size == 0:
        return f"| {streams} | {mode} | 0 | - | - | - |"
    p50, p99 = np.percentile(ms, [50, 99])
    ratio = p99 / TARGET_P99_MS
    return f"| {streams} | {mode} | {ms.size} | {p50:.1f} | {p99:.1f} | {ratio:.1f}x |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", help="an existing cluster (default: start a local broker)")
    parser.add_argument("--streams", type=int, nargs="+", default=[2, 100])
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per row")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--warm-s", type=float, default=20.0, help="an unreported first row (the broker's JIT)"
    )
    parser.add_argument("--commit-ms", type=float, default=100.0, help="cadenced/alternating")
    args = parser.parse_args(argv)
    commit_s = args.commit_ms / 1000
    with cluster(args.bootstrap) as bootstrap:
        measure(bootstrap, args.streams[-1], args.modes[0], args.warm_s, commit_s)
        lines = []
        for n in args.streams:
            for mode in args.modes:
                print(f"{n} streams, {mode} ...", file=sys.stderr, flush=True)
                lines.append(row(n, mode, measure(bootstrap, n, mode, args.seconds, commit_s)))
    print("| streams | relay writes | windows | p50 ms | p99 ms | p99 / 15 ms target |")
    print("|---:|---|---:|---:|---:|---:|")
    print("\n".join(lines))
    print(f"\ncommand: python -m bench.bench_listener_floor {' '.join(argv or sys.argv[1:])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
