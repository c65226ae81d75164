"""The fault matrix (issue 19): a realtime talker and two `codeclog vocode` members on a local
3-node cluster (RF 3, min ISR 2), one fault per run, injected at a seeded random moment.

Faults (`--faults`, default all):

  leader       kill -9 the leader of chunk partition 0, restart it
  coordinator  kill -9 the transaction coordinator of member a's transactional id, restart it
  pause        SIGSTOP the leader of chunk partition 0 for 20 s, then SIGCONT
  rolling      a rolling restart of all three nodes (SIGTERM, start, next)
  down         the whole cluster down (kill -9 all three) for 15 s, then started again
  member       kill -9 the leader of chunk partition 0 and, 1 s later, member a; both come back

After each run: the talker's publisher reports its lost (failed or undelivered) records,
`verify` replays the chunk topic and compares every window, and an independent audit
(bench/audit.py: the .avsc files + confluent-kafka + fastavro only) reads the audio topic and
checks every window once, hashes, indices and sample offsets contiguous; the DLQ must be empty.
Measured per fault, from a read_committed probe on the audio topic: the longest gap between
two audio commits becoming visible while the talker speaks (before the fault and from the
fault on), and the chunk latency (produced_at of a window's newest chunk -> visible) p99
before and during the fault (chunks produced from the fault to 5 s after it ended).

    python bench/faults.py --seed 7                      # the full matrix (about 15-20 min)
    python bench/faults.py --faults leader pause --seed 3
    python bench/faults.py --latency                     # + Kafka path, 3 nodes vs 1 node

`--table` prints the README "Fault matrix" table; `--json FILE` writes every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.audit import AuditReport, audit, decode, shipped_schemas  # noqa: E402

FAULTS = ("leader", "coordinator", "pause", "rolling", "down", "member")
PAUSE_S = 20.0
DOWN_S = 15.0
MEMBER_READY_S = 240.0  # two members loading torch on a loaded 2-core box
DRAIN_S = 300.0
MEMBER_OUTAGE_S = 300  # --outage-timeout of the members
AFTER_FAULT_S = 5.0
WARM_S = 5.0  # chunks of the talker's first seconds are not counted (producer id, JIT)
INJECT_AFTER_S = 12.0  # the fault comes 12-20 s after the talker started
SESSIONS_PER_ROUND = 3
ROUND_S = 8.0
PARTITIONS = 4
TRANSACTION_STATE_PARTITIONS = 3  # codeclog.cluster.INTERNAL_PARTITIONS


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (UTF-16 code units), as a signed 32-bit int."""
    value = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        value = (31 * value + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def transaction_state_partition(transactional_id: str) -> int:
    """The broker's TransactionStateManager.partitionFor: Utils.abs(hashCode) % partitions."""
    return (java_string_hash(transactional_id) & 0x7FFFFFFF) % TRANSACTION_STATE_PARTITIONS


def leader_of(client: dict[str, str], topic: str, partition: int) -> int:
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + 60
    while True:
        try:
            metadata = AdminClient({**client, "log_level": "2"}).list_topics(topic, timeout=10)
            leader = int(metadata.topics[topic].partitions[partition].leader)
            if leader >= 0:
                return leader
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise RuntimeError(f"no leader for {topic}[{partition}] within 60 s")
        time.sleep(0.5)


class Probe(threading.Thread):
    """A read_committed reader of the audio topic: when each window became visible."""

    def __init__(self, client: dict[str, str], topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.consumer = Consumer(
            {
                **client,
                "group.id": f"faults-probe-{uuid.uuid4().hex[:6]}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
                "log_level": 2,
            }
        )
        # assign, no group: a group join waits for a coordinator (seconds on a fresh cluster)
        partitions = self.consumer.list_topics(topic, timeout=30).topics[topic].partitions
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        self.schemas = shipped_schemas()
        self.seen: list[tuple[float, int]] = []  # (visible at, produced_at ms)
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            for message in self.consumer.consume(500, 0.05):
                if message.error() is not None:
                    continue
                now = time.time()
                try:
                    _name, chunk = decode(message.value() or b"", self.schemas)
                except ValueError:
                    continue
                self.seen.append((now, int(chunk.get("source_produced_at_ms", 0))))
        self.consumer.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(30)


class LiveTalker(threading.Thread):
    """Rounds of realtime synthetic duplex sessions until stopped, over one publisher."""

    def __init__(self, client: dict[str, str], topic: str, seed: int) -> None:
        super().__init__(daemon=True)
        from codeclog.producers.publisher import ChunkPublisher, PublisherConfig
        from codeclog.producers.talker import Talker

        config = PublisherConfig(
            topic=topic, producer_id="faults-talker", delivery_timeout_ms=240_000
        )
        self.publisher = ChunkPublisher(client, config)
        self.talker = Talker(self.publisher, producer_id="faults-talker", native_duplex=True)
        self.seed = seed
        self.records = 0
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from codeclog.producers.synthetic import SyntheticConfig, merged, play, scripts
        from codeclog.producers.talker import wall_clock_ms

        round_no = 0
        try:
            while not self.halt.is_set():
                synthetic = SyntheticConfig(
                    sessions=SESSIONS_PER_ROUND, seconds=ROUND_S, seed=self.seed * 1000 + round_no
                )
                result = play(
                    merged(scripts(synthetic)),
                    self.talker.apply,
                    total_s=ROUND_S,
                    realtime=True,
                    clock=time.monotonic,
                    sleep=time.sleep,
                    now_ms=wall_clock_ms,
                )
                self.records += result.records
                round_no += 1
        except BaseException as exc:  # reported in the row, never lost
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(ROUND_S * 3)


@dataclasses.dataclass
class Members:
    """The `codeclog vocode` member processes of one run."""

    client: dict[str, str]
    topics_file: Path
    group: str
    logs: Path
    processes: dict[str, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)
    exits: list[str] = dataclasses.field(default_factory=list)
    starts: dict[str, int] = dataclasses.field(default_factory=dict)

    def start(self, name: str) -> None:
        self.starts[name] = self.starts.get(name, 0) + 1
        log = (self.logs / f"member-{name}-{self.starts[name]}.log").open("wb")
        command = [
            sys.executable,
            "-m",
            "codeclog.cli",
            "vocode",
            "--bootstrap",
            self.client["bootstrap.servers"],
            "--topics-config",
            str(self.topics_file),
            "--group",
            self.group,
            "--instance-id",
            name,
            "--stop-timeout",
            "60",
            # the whole cluster down takes ~75 s here (15 s + a cold start): past the 60 s default
            "--outage-timeout",
            str(MEMBER_OUTAGE_S),
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
        self.processes[name] = subprocess.Popen(
            command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env
        )

    def log_text(self, name: str) -> str:
        path = self.logs / f"member-{name}-{self.starts[name]}.log"
        return path.read_text(errors="replace")

    def wait_ready(self, name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while "state restored in" not in self.log_text(name):
            process = self.processes[name]
            if process.poll() is not None:
                raise RuntimeError(f"member {name} exited {process.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"member {name} not assigned within {timeout_s} s")
            time.sleep(0.25)

    def kill(self, name: str) -> None:
        self.processes[name].send_signal(signal.SIGKILL)
        self.processes[name].wait()
        self.exits.append(f"{name} SIGKILLed")

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for name, process in self.processes.items():
            try:
                code = process.wait(90)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
                self.exits.append(f"{name} did not stop on SIGTERM")
            if code not in (0, -signal.SIGKILL):
                self.exits.append(f"{name} exited {code}")

    def crashed(self) -> list[str]:
        return [
            f"{name} exited {p.returncode}"
            for name, p in self.processes.items()
            if p.poll() is not None and p.returncode not in (0, -signal.SIGKILL)
        ]

    def tail(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in sorted(self.logs.glob("member-*.log"))
        )


@dataclasses.dataclass
class FaultContext:
    cluster: Any
    client: dict[str, str]
    topics: Any
    members: Members
    notes: list[str] = dataclasses.field(default_factory=list)


def _restart(ctx: FaultContext, node: int) -> float:
    started = time.monotonic()
    ctx.cluster.restart(node)
    return time.monotonic() - started


def fault_leader(ctx: FaultContext) -> None:
    victim = leader_of(ctx.client, ctx.topics.chunks, 0)
    ctx.cluster.kill(victim)
    time.sleep(5.0)
    ctx.notes.append(
        f"node {victim} (leader of chunks[0]) SIGKILL; back in {_restart(ctx, victim):.0f} s"
    )


def fault_coordinator(ctx: FaultContext) -> None:
    tid = f"{ctx.members.group}-a"
    victim = leader_of(ctx.client, "__transaction_state", transaction_state_partition(tid))
    ctx.cluster.kill(victim)
    time.sleep(5.0)
    ctx.notes.append(
        f"node {victim} (transaction coordinator of {tid}) SIGKILL; back in "
        f"{_restart(ctx, victim):.0f} s"
    )


def fault_pause(ctx: FaultContext) -> None:
    victim = leader_of(ctx.client, ctx.topics.chunks, 0)
    ctx.cluster.pause(victim)
    time.sleep(PAUSE_S)
    ctx.cluster.resume(victim)
    ctx.notes.append(f"node {victim} (leader of chunks[0]) SIGSTOP {PAUSE_S:.0f} s, SIGCONT")


def fault_rolling(ctx: FaultContext) -> None:
    took = [f"{_restart(ctx, node):.0f}" for node in ctx.cluster.layout().node_ids]
    ctx.notes.append(f"rolling restart of nodes 1-3 ({' + '.join(took)} s)")


def fault_down(ctx: FaultContext) -> None:
    nodes = list(ctx.cluster.layout().node_ids)
    for node in nodes:
        ctx.cluster.kill(node)
    time.sleep(DOWN_S)
    started = time.monotonic()
    ctx.cluster.start()
    ctx.notes.append(
        f"all nodes SIGKILL, down {DOWN_S:.0f} s, serving again {time.monotonic() - started:.0f} s "
        "after start"
    )


def fault_member(ctx: FaultContext) -> None:
    victim = leader_of(ctx.client, ctx.topics.chunks, 0)
    ctx.cluster.kill(victim)
    time.sleep(1.0)
    ctx.members.kill("a")
    time.sleep(4.0)
    back = _restart(ctx, victim)
    ctx.members.start("a")
    ctx.notes.append(
        f"node {victim} (leader of chunks[0]) SIGKILL, member a SIGKILL 1 s later; node back "
        f"in {back:.0f} s, member a restarted"
    )


FAULT_ACTIONS: dict[str, Callable[[FaultContext], None]] = {
    "leader": fault_leader,
    "coordinator": fault_coordinator,
    "pause": fault_pause,
    "rolling": fault_rolling,
    "down": fault_down,
    "member": fault_member,
}


@dataclasses.dataclass
class FaultRow:
    fault: str
    what: str
    injected_after_s: float
    talker_records: int
    talker_lost: int
    verify_ok: bool
    expected_windows: int
    missing: int
    duplicated: int
    mismatched: int
    audit: dict[str, Any]
    audit_matches_verify: bool
    dead_letters: int
    gap_before_s: float
    gap_during_s: float
    p99_before_ms: float
    p99_during_ms: float
    member_exits: list[str]
    error: str = ""

    @property
    def ok(self) -> bool:
        return (
            not self.error
            and self.verify_ok
            and self.talker_lost == 0
            and self.audit["ok"]
            and self.audit_matches_verify
            and self.dead_letters == 0
        )


def _gaps(seen: list[tuple[float, int]], start: float, end: float) -> float:
    """The longest time between two windows becoming visible, from the last one before
    `start` up to the last one at or before `end` (a stall over `start` counts whole)."""
    times = sorted(t for t, _ in seen)
    inside = [t for t in times if start <= t <= end]
    before = [t for t in times if t < start]
    window = before[-1:] + inside
    if len(window) < 2:
        return float("nan")
    return float(max(b - a for a, b in itertools.pairwise(window)))


def run_fault(
    cluster: Any,
    fault: str,
    rng: random.Random,
    engine: Any,
    workdir: Path,
    seed: int,
    inject_after_s: float = INJECT_AFTER_S,
) -> FaultRow:
    """One fault on `cluster`: fresh topics and group, two members, the live talker; the fault
    comes `inject_after_s` plus 0-8 s (seeded) after the talker started."""
    from codeclog.consumers.verify import verify
    from codeclog.topics import create_topics
    from codeclog.topics_config import TopicsConfig

    run = f"{fault}-{uuid.uuid4().hex[:6]}"
    topics = TopicsConfig(
        chunks=f"fm-{run}-chunks",
        audio=f"fm-{run}-audio",
        dlq=f"fm-{run}-dlq",
        progress=f"fm-{run}-progress",
        partitions=PARTITIONS,
    )
    client = {"bootstrap.servers": cluster.bootstrap}
    create_topics(client, topics)
    logs = workdir / run
    logs.mkdir(parents=True)
    topics_file = logs / "topics.json"
    topics_file.write_text(json.dumps(dataclasses.asdict(topics)))
    members = Members(client, topics_file, f"fm-{run}", logs)
    ctx = FaultContext(cluster, client, topics, members)
    probe = Probe(client, topics.audio)
    talker = LiveTalker(client, topics.chunks, seed)
    error = ""
    fault_at = fault_end = talk_start = time.time()
    delay = 0.0
    try:
        members.start("a")
        members.start("b")
        members.wait_ready("a", MEMBER_READY_S)
        members.wait_ready("b", MEMBER_READY_S)
        probe.start()
        talk_start = time.time()
        talker.start()
        delay = rng.uniform(inject_after_s, inject_after_s + 8.0)
        time.sleep(delay)
        fault_at = time.time()
        FAULT_ACTIONS[fault](ctx)
        fault_end = time.time()
        time.sleep(AFTER_FAULT_S)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        talker.stop()
    close = talker.publisher.close(240)
    lost = talker.publisher.stats.failed + close.undelivered
    if talker.error is not None:
        error = error or f"talker: {talker.error}"
    with_nodes_up(cluster)
    drain_error = _wait_drained(client, members.group, topics.chunks, DRAIN_S)
    error = error or drain_error
    crashed = members.crashed()
    members.stop_all()
    probe.stop()
    report = verify(client, topics, engine)
    checked: AuditReport = audit(client, topics.audio, topics.dlq)
    audit_keys = set(checked.windows)
    verify_keys_count = report.expected_windows
    matches = (
        len(audit_keys) == verify_keys_count
        and not report.missing
        and not report.unexpected
        and not report.mismatched
    )
    warm = talk_start + WARM_S
    before = [(t - p / 1000) * 1000 for t, p in probe.seen if p and warm <= p / 1000 < fault_at]
    during = [
        (t - p / 1000) * 1000
        for t, p in probe.seen
        if p and fault_at <= p / 1000 <= fault_end + AFTER_FAULT_S
    ]
    if error:
        (logs / "members.txt").write_text(members.tail())
    return FaultRow(
        fault=fault,
        what="; ".join(ctx.notes) or "(not injected)",
        injected_after_s=round(delay, 1),
        talker_records=talker.records,
        talker_lost=lost,
        verify_ok=report.ok,
        expected_windows=report.expected_windows,
        missing=len(report.missing),
        duplicated=len(report.duplicated),
        mismatched=len(report.mismatched),
        audit=checked.summary(),
        audit_matches_verify=matches,
        dead_letters=checked.dead_letters,
        gap_before_s=_gaps(probe.seen, warm, fault_at),
        gap_during_s=_gaps(probe.seen, fault_at, time.time()),  # until drained
        p99_before_ms=_percentile(before, 99),
        p99_during_ms=_percentile(during, 99),
        member_exits=list(dict.fromkeys(crashed + members.exits)),
        error=error,
    )


def _wait_drained(client: dict[str, str], group: str, topic: str, timeout_s: float) -> str:
    """ "" when the group committed the topic to its end within timeout_s, else why not. A
    measurement that fails (metadata still moving after a fault: "leader epoch is newer than
    broker epoch") is asked again, not taken for the end of the run."""
    from codeclog.lag.drain import undrained, wait_drained

    deadline = time.monotonic() + timeout_s
    why = ""
    while time.monotonic() < deadline:
        try:
            report = wait_drained(client, group, topic, max(1.0, deadline - time.monotonic()))
        except Exception as exc:
            why = f"drain: {exc}"
            time.sleep(1.0)
            continue
        if report.drained:
            return ""
        why = f"not drained after {timeout_s:.0f} s: {'; '.join(undrained(report))}"
    return why


def with_nodes_up(cluster: Any) -> None:
    """Every node running and unpaused (a fault that failed half-way leaves none behind)."""
    from codeclog.cluster import NodeStatusKind

    for status in cluster.status():
        if status.kind is NodeStatusKind.PAUSED:
            cluster.resume(status.node_id)
    cluster.start()


def fault_table(rows: list[FaultRow]) -> str:
    lines = [
        "| fault | what happened | lost | duplicated | audio gap before / from the fault "
        "| chunk latency p99 before / during | result |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lost = r.talker_lost + r.missing
        duplicated = r.duplicated + r.audit["duplicated"]
        exits = f"; members: {', '.join(r.member_exits)}" if r.member_exits else ""
        result = "ok" if r.ok else f"FAILED {r.error}".strip()
        lines.append(
            f"| {r.fault} | {r.what}{exits} | {lost} | {duplicated} "
            f"| {r.gap_before_s:.1f} s / {r.gap_during_s:.1f} s "
            f"| {r.p99_before_ms:.0f} / {r.p99_during_ms:.0f} ms | {result} |"
        )
    return "\n".join(lines)


def latency_rows(cluster_bootstrap: str, workdir: Path, streams: int, seconds: float) -> str:
    """The Kafka path (bench_consumer's instant engine) on the 3-node cluster and on one broker,
    in the same run."""
    from bench.bench_consumer import InstantEngine, kafka_path
    from codeclog.broker import BrokerSettings, LocalBroker

    single = LocalBroker(
        workdir / "single",
        BrokerSettings(heap_max_mb=512, start_timeout_s=180, die_with_parent=True),
    )
    bootstrap = single.start().bootstrap
    lines = [
        "| cluster | acks | streams | e2e p50 / p99 ms | added by Kafka p50 / p99 ms "
        "| of which step minus decode p50 / p99 ms |",
        "|---|---|---:|---:|---:|---:|",
    ]
    try:
        engine = InstantEngine()
        for name, where in (
            ("1 node (RF 1)", bootstrap),
            ("3 nodes (RF 3, min ISR 2)", cluster_bootstrap),
        ):
            kafka_path(where, engine, 10, 6.0)  # warm the coordinators and the JIT
            r = kafka_path(where, engine, streams, seconds)
            lines.append(
                f"| {name} | all | {streams} | {r['e2e_p50_ms']:.0f} / {r['e2e_p99_ms']:.0f} "
                f"| {r['added_p50_ms']:.0f} / {r['added_p99_ms']:.0f} "
                f"| {r['txn_p50_ms']:.0f} / {r['txn_p99_ms']:.0f} |"
            )
    finally:
        single.stop()
    return "\n".join(lines)


def start_cluster(data_dir: Path) -> Any:
    from codeclog.broker import BrokerSettings
    from codeclog.cluster import LocalCluster

    settings = BrokerSettings(
        heap_min_mb=128,
        heap_max_mb=512,
        start_timeout_s=180,
        die_with_parent=True,
        extra_jvm_args=("-XX:TieredStopAtLevel=1",),
    )
    cluster = LocalCluster(data_dir, 3, settings)
    cluster.start()
    return cluster


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    parser.add_argument("--seed", type=int, default=7, help="the moments of injection")
    parser.add_argument("--latency", action="store_true", help="also 3 nodes vs 1, instant engine")
    parser.add_argument("--streams", type=int, default=50, help="streams of the latency rows")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of a latency row")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--keep", type=Path, help="keep cluster data and member logs here")
    args = parser.parse_args()

    from codeclog.vocoder.engine import Code2WavEngine

    # librdkafka's lines about the brokers this script takes down are expected: not on stderr
    kafka_log = logging.getLogger("codeclog.kafka")
    kafka_log.addHandler(logging.NullHandler())
    kafka_log.propagate = False
    engine = Code2WavEngine.from_spec("tiny")
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)
        started = time.monotonic()
        cluster = start_cluster(workdir / "cluster")
        rows: list[FaultRow] = []
        latency = ""
        try:
            for fault in args.faults:
                row = run_fault(cluster, fault, rng, engine, workdir, args.seed)
                rows.append(row)
                print(json.dumps(dataclasses.asdict(row)), flush=True)
            if args.latency:
                latency = latency_rows(cluster.bootstrap, workdir, args.streams, args.seconds)
        finally:
            cluster.stop()
        took = time.monotonic() - started
    print()
    print(fault_table(rows))
    if latency:
        print()
        print(latency)
    load = os.getloadavg()[0]
    print(
        f"\n{len(rows)} faults in {took / 60:.1f} min, load average {load:.1f} "
        f"on {os.cpu_count()} cores"
    )
    print(f"command: python bench/faults.py {' '.join(sys.argv[1:])}".rstrip())
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
