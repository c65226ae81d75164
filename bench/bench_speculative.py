"""Speculative delivery against the bare hand-off, on one broker in one run (issue 42).

Rows of two kinds take turns, `--pairs` times (floor, member, floor, member, ...), at
`--streams` real-time streams, after one unreported row of each (a fresh broker's JIT):

- floor: `bench_listener_floor`'s "plain" relay: a talker process writes small chunk records,
  the relay (this process) reads them and writes one 48 KB audio record per 25th chunk of a
  stream with an idempotent producer, no transaction, no fold, no decode; a listener process
  reads the audio. The floor of any design.
- member: the real consumer service (`VocoderService`, what `codeclog vocode` runs) with the
  zero-cost instant engine (bench_consumer.InstantEngine), in this process; the synthetic talker
  (`codeclog talk`'s) in its own process; a speculative and a committed `AudioListener`, each in
  its own process.

Both rows' talkers send their streams' records spread over time: the floor's talker writes each
millisecond what is due; the member row's synthetic talker runs each session on its own frame
clock (`Speech(phased=True)`: session i of n steps i/n of a frame after the 40 ms grid). With
`--aligned-talker` every session steps at the same instant each frame (one talker replica
batching its sessions): the member row then gets its records in bursts of about six every 40
ms, which the floor's talker never sends, and each record of a burst waits behind the others
at every hop (BENCHMARKS.md, issue 42, run L).

Latency = produced_at of the chunk that completes a window (its newest chunk) -> the moment the
listener's consume() returned the window's first copy; chunks of a row's first seconds are not
counted. Each row splits its median at the window's produce() (the audio record's timestamp):
before it the talker, the broker, the consumer and the step; after it the write, the broker and
the listener (timestamps are whole ms). Each member row also reports the committed listener.
Each row reports the CPU seconds (user + system) of this process (the member or the relay), of
the processes it waited for (the talker and the listeners) and of the broker JVM (utime +
stime from /proc/<pid>/stat, only on the broker this script starts), and the bytes the logs of
what it writes grew by (.log segment files of the audio, live, dead-letter and progress topics
and of the internal transaction and offsets topics; the floor: its audio topic and the
internal ones), both per second of audio. The last line:

    speculative p50 <a> / p99 <b> ms, plain floor p50 <c> / p99 <d> ms at 100 streams:
    p50 <R>x, p99 <Q>x                                               (on one line)

a to d are medians over the pairs of each row's percentile; R and Q are the medians over the
pairs of each pair's ratio (member / floor). /proc/loadavg is printed before and after.

    python -m bench.bench_speculative                       # 100 streams, 3 pairs, 15 s rows
    python -m bench.bench_speculative --no-live --pairs 1   # the member without live copies
    python -m bench.bench_speculative --no-committed        # without the committed listener
    python -m bench.bench_speculative --aligned-talker      # sessions step together each frame
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np

from bench.bench_consumer import InstantEngine, ListenerProbe
from bench.bench_listener_floor import measure_hops as floor_hops
from bench.local_broker import Cluster, local_cluster
from codeclog.schemas.records import SAMPLE_RATE_HZ

WARMUP_S = 3.0  # a member row's first seconds are not counted (group join, producer ids)
WINDOW_S = 1.0  # audio per record the floor writes (48 KB: a second of 24 kHz s16le)


class Broker:
    """The cluster of the run; with the broker's pid and log dirs when this script started it."""

    def __init__(self, cluster: Cluster) -> None:
        self.bootstrap = cluster.bootstrap
        self.pid = cluster.pid
        self.log_dirs = cluster.log_dirs

    def cpu_s(self) -> float:
        """The broker JVM's CPU seconds so far (utime + stime), NaN when not known."""
        if self.pid is None:
            return float("nan")
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def topics(self) -> set[str]:
        if self.log_dirs is None:
            return set()
        return {f.name.rsplit("-", 1)[0] for f in self.log_dirs.iterdir() if f.is_dir()}

    def log_bytes(self, prefixes: tuple[str, ...]) -> int:
        """Bytes of the .log segments of the topics named by `prefixes` (partition folders
        are <topic>-<n>)."""
        if self.log_dirs is None:
            return 0
        total = 0
        for folder in self.log_dirs.iterdir():
            if folder.is_dir() and folder.name.rsplit("-", 1)[0] in prefixes:
                total += sum(f.stat().st_size for f in folder.glob("*.log"))
        return total


INTERNAL = ("__transaction_state", "__consumer_offsets")


@dataclasses.dataclass
class Row:
    kind: str
    latencies: np.ndarray  # ms
    committed: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    audio_s: float = 0.0
    cpu_s: float = float("nan")  # the broker JVM's
    log_bytes: int = 0
    live_first: float = float("nan")  # share of windows the speculative listener heard live
    # of each latency, the part before the window's produce() (its record's timestamp): the
    # talker, the broker, the consumer and the step; the rest is the write, the broker, the
    # listener
    to_write: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    cpu_here_s: float = float("nan")  # this process's: the member (its threads) or the relay
    cpu_children_s: float = float("nan")  # the talker's and the listeners' processes

    def p(self, q: float, committed: bool = False) -> float:
        values = self.committed if committed else self.latencies
        return float(np.percentile(values, q)) if values.size else float("nan")


@dataclasses.dataclass(frozen=True)
class MemberShape:
    """What a member row runs: live copies, the committed listener, a phased talker."""

    live: bool = True
    committed: bool = True
    phased: bool = True


def _talk(bootstrap: str, topic: str, streams: int, seconds: float, phased: bool) -> None:
    from codeclog.devtools.talker import Speech, Voice
    from codeclog.producers.publisher import PublisherConfig

    voice = Voice({"bootstrap.servers": bootstrap}, PublisherConfig(topic=topic, producer_id="b"))
    voice.speak(Speech(sessions=streams, seconds=seconds, seed=1, phased=phased), realtime=True)
    voice.close(30)


def member_row(broker: Broker, streams: int, seconds: float, shape: MemberShape) -> Row:
    """The service with the instant engine, the talker and two listeners in processes (without
    the committed one when not `shape.committed`)."""
    import multiprocessing

    from codeclog.consumers.member.service import VocodeConfig, VocoderService
    from codeclog.consumers.readers.listener import Isolation
    from codeclog.kafka.topics import ensure_topics
    from codeclog.lag.drain import wait_drained
    from codeclog.topics_config import TopicsConfig

    run = uuid.uuid4().hex[:8]
    name = f"spec-{run}"
    topics = TopicsConfig(
        chunks=f"{name}-chunks",
        audio=f"{name}-audio",
        dlq=f"{name}-dlq",
        progress=f"{name}-progress",
    )
    client = {"bootstrap.servers": broker.bootstrap}
    ensure_topics(client, topics)
    stop = threading.Event()
    config = VocodeConfig(
        group=f"spec-{run}",
        instance_id="bench",
        max_records=128,
        max_batch=128,
        live_audio=shape.live,
    )
    service = VocoderService(client, topics, config, InstantEngine(), stop_event=stop)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    kinds = [i for i in Isolation if shape.committed or i is not Isolation.COMMITTED]
    probes = {i: ListenerProbe(broker.bootstrap, topics.audio, i) for i in kinds}
    time.sleep(3.0)  # the member joins its group before the talker starts
    mine = (topics.audio, topics.live, topics.dlq, topics.progress)  # what the member writes
    cpu, size = broker.cpu_s(), broker.log_bytes(INTERNAL)
    here, children = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN)
    started = time.time()
    talker = multiprocessing.get_context("spawn").Process(
        target=_talk, args=(broker.bootstrap, topics.chunks, streams, seconds, shape.phased)
    )
    talker.start()
    talker.join(seconds + 120)
    wait_drained(client, config.group, topics.chunks, timeout_s=120)
    time.sleep(1.0)  # the listeners read the last commit
    cpu = broker.cpu_s() - cpu
    size = broker.log_bytes(mine) + broker.log_bytes(INTERNAL) - size
    stop.set()
    thread.join(30)
    here = _cpu_s(resource.RUSAGE_SELF) - here
    for probe in probes.values():
        probe.stop()
    children = _cpu_s(resource.RUSAGE_CHILDREN) - children  # the talker and the listeners
    steady = (started + WARMUP_S) * 1000

    def latencies(probe: ListenerProbe) -> np.ndarray:
        return np.asarray([(at - p / 1000) * 1000 for p, _, at in probe.visible if p >= steady])

    speculative = probes[Isolation.SPECULATIVE]
    windows = len(speculative.visible)
    return Row(
        "member" if shape.live else "member, no live copies",
        latencies(speculative),
        latencies(probes[Isolation.COMMITTED]) if shape.committed else np.zeros(0),
        speculative.samples / SAMPLE_RATE_HZ,
        cpu,
        size,
        speculative.live_first / windows if windows else float("nan"),
        np.asarray([w - p for p, w, _ in speculative.visible if p >= steady], dtype=np.float64),
        here,
        children,
    )


def floor_row(broker: Broker, streams: int, seconds: float) -> Row:
    cpu, internal = broker.cpu_s(), broker.log_bytes(INTERNAL)
    here, children = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN)
    before = broker.topics()
    hops = floor_hops(broker.bootstrap, streams, "plain", seconds, 0.1)
    cpu = broker.cpu_s() - cpu
    here = _cpu_s(resource.RUSAGE_SELF) - here
    children = _cpu_s(resource.RUSAGE_CHILDREN) - children  # the talker and the listener
    audio = tuple(t for t in broker.topics() - before if t.startswith("floor-audio-"))
    size = broker.log_bytes(audio) + broker.log_bytes(INTERNAL) - internal
    audio_s = _records(broker.bootstrap, audio) * WINDOW_S  # its warm-up seconds' too
    return Row(
        "plain floor",
        hops[:, 0],
        audio_s=audio_s,
        cpu_s=cpu,
        log_bytes=size,
        to_write=hops[:, 1],
        cpu_here_s=here,
        cpu_children_s=children,
    )


def _cpu_s(who: int) -> float:
    """CPU seconds (user + system) of this process (RUSAGE_SELF: every thread) or of its
    children waited for (RUSAGE_CHILDREN) so far."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _records(bootstrap: str, topics: tuple[str, ...]) -> int:
    """Records on `topics` (the sum of their partitions' high watermarks)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-speculative"})
    try:
        metadata = consumer.list_topics(timeout=10)
        parts = [TopicPartition(t, p) for t in topics for p in metadata.topics[t].partitions]
        return sum(consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts)
    finally:
        consumer.close()


def _ms(value: float) -> str:
    return f"{value:.1f}"


def table(rows: list[Row]) -> str:
    lines = [
        "| row | windows | speculative p50 / p99 ms | of which to the write / after it, p50 ms "
        "| committed p50 / p99 ms | heard live | CPU s per audio s: member or relay "
        "/ talker and listeners / broker | log bytes per audio s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        committed = (
            f"{_ms(row.p(50, True))} / {_ms(row.p(99, True))}" if row.committed.size else "-"
        )
        live = "-" if np.isnan(row.live_first) else f"{row.live_first:.0%}"
        per_s = row.audio_s or float("nan")
        split = "-"
        if row.to_write.size:
            before = float(np.percentile(row.to_write, 50))
            after = float(np.percentile(row.latencies - row.to_write, 50))
            split = f"{_ms(before)} / {_ms(after)}"
        lines.append(
            f"| {row.kind} | {row.latencies.size} | {_ms(row.p(50))} / {_ms(row.p(99))} "
            f"| {split} | {committed} | {live} | {row.cpu_here_s / per_s:.4f} / "
            f"{row.cpu_children_s / per_s:.4f} / {row.cpu_s / per_s:.4f} "
            f"| {row.log_bytes / per_s:,.0f} |"
        )
    return "\n".join(lines)


def summary(pairs: list[tuple[Row, Row]], streams: int) -> str:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    a = median([m.p(50) for _, m in pairs])
    b = median([m.p(99) for _, m in pairs])
    c = median([f.p(50) for f, _ in pairs])
    d = median([f.p(99) for f, _ in pairs])
    r = median([m.p(50) / f.p(50) for f, m in pairs])
    q = median([m.p(99) / f.p(99) for f, m in pairs])
    return (
        f"speculative p50 {a:.1f} / p99 {b:.1f} ms, plain floor p50 {c:.1f} / p99 {d:.1f} ms "
        f"at {streams} streams: p50 {r:.2f}x, p99 {q:.2f}x"
    )


def _load() -> str:
    return Path("/proc/loadavg").read_text().strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", help="an existing cluster (default: start a local broker)")
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=15.0, help="talking seconds per row")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--warm-s", type=float, default=20.0, help="the unreported first rows")
    parser.add_argument(
        "--no-live", action="store_true", help="the member writes no live copies (cost: before)"
    )
    parser.add_argument(
        "--no-committed",
        action="store_true",
        help="the member row without the committed listener's process (what it costs the rest)",
    )
    parser.add_argument(
        "--aligned-talker",
        action="store_true",
        help="the member row's sessions step together each 40 ms frame (default: each on its "
        "own frame clock, spread as the floor's talker spreads its streams)",
    )
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        help="sys.setswitchinterval in this process (the member's and the relay's; default 5)",
    )
    args = parser.parse_args(argv)
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    print(f"load before: {_load()}", flush=True)
    shape = MemberShape(not args.no_live, not args.no_committed, not args.aligned_talker)
    with local_cluster(args.bootstrap) as found:
        broker = Broker(found)
        floor_row(broker, args.streams, args.warm_s)
        member_row(broker, args.streams, args.warm_s, shape)
        pairs: list[tuple[Row, Row]] = []
        for n in range(args.pairs):
            print(f"pair {n + 1} of {args.pairs} ...", file=sys.stderr, flush=True)
            floor = floor_row(broker, args.streams, args.seconds)
            member = member_row(broker, args.streams, args.seconds, shape)
            pairs.append((floor, member))
    print(f"load after: {_load()}")
    print(table([row for pair in pairs for row in pair]))
    print(f"\ncommand: python -m bench.bench_speculative {' '.join(argv or sys.argv[1:])}".rstrip())
    print(summary(pairs, args.streams))
    return 0


if __name__ == "__main__":
    sys.exit(main())
