"""One run of the fault matrix on a local 3-node cluster (RF 3, min ISR 2): a
realtime talker and two `codeclog vocode` members, one fault injected at a seeded random
moment, then the checks. `python -m bench.faults` runs the whole matrix and prints its table;
tests/broker/test_cluster_faults.py runs one fault of it. The faults: fault_actions.

After each run: the talker's publisher reports its lost (failed or undelivered) records,
`verify` replays the chunk topic and compares every window, and an independent audit
(codeclog.devtools.audit: the .avsc files + confluent-kafka + fastavro only) reads the audio
topic and checks every window once, hashes, indices and sample offsets contiguous; the DLQ must
be empty; a speculative listener (the live and the audio topic) must have played every committed
window once, with its bytes, each confirmed by its committed copy, and nothing else. Measured
per fault, from a read_committed probe on the audio topic: the longest gap
between two audio commits becoming visible while the talker speaks (before the fault and from
the fault on), and the chunk latency (produced_at of a window's newest chunk -> visible) p99
before and during the fault (chunks produced from the fault to 5 s after it ended).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import time
import uuid
from pathlib import Path
from typing import Any

from codeclog.devtools.audit import AuditReport, audit
from codeclog.devtools.cluster import LocalCluster
from codeclog.devtools.fault_actions import FAULT_ACTIONS, FaultContext, with_nodes_up
from codeclog.devtools.history import Topics as HistoryTopics
from codeclog.devtools.history import check, describe_logs, read_history
from codeclog.devtools.links import LinkUsageError
from codeclog.devtools.members import READY_LINE, Members, wait_group_drained
from codeclog.devtools.network_faults import NETWORK_FAULT_ACTIONS, faketime_env
from codeclog.devtools.probe import AudioProbe, ListenerProbe
from codeclog.devtools.stack import write_topics_file
from codeclog.devtools.stats import percentile
from codeclog.devtools.talker import LiveTalker, Speech, Voice
from codeclog.kafka.topics import create_topics
from codeclog.producers.publisher import PublisherConfig
from codeclog.topics_config import TopicsConfig

MEMBER_READY_S = 240.0  # two members loading torch on a loaded 2-core box
MEMBER_STOP_S = 90.0
DRAIN_S = 300.0
AFTER_FAULT_S = 5.0
WARM_S = 5.0  # chunks of the talker's first seconds are not counted (producer id, JIT)
INJECT_AFTER_S = 12.0  # the fault comes 12-20 s after the talker started
SESSIONS_PER_ROUND = 3
ROUND_S = 8.0
TALKER_CLOSE_S = 240.0  # the talker's delivery timeout too: it rides out every fault
PARTITIONS = 4
CHECKER_FAILED = "checker_failed"  # the history checker raised: the row fails, the matrix goes on


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
    listener: dict[str, int]  # the speculative listener against the committed audio
    dead_letters: int
    gap_before_s: float
    gap_during_s: float
    p99_before_ms: float
    p99_during_ms: float
    member_exits: list[str]
    anomalies: dict[str, int] = dataclasses.field(default_factory=dict)  # history, by kind
    examples: list[str] = dataclasses.field(default_factory=list)  # a few of them, spelled out
    history_logs: str = ""  # which node's log gave each partition's fates, and if complete
    recovery_s: float = float("nan")  # the fault's end -> the next window visible
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
            and not any(self.anomalies.values())
            and bool(self.listener.get("ok"))
        )

    @property
    def lost(self) -> int:
        return self.talker_lost + self.missing

    @property
    def duplicates(self) -> int:
        return self.duplicated + int(self.audit["duplicated"])

    def summary(self) -> dict[str, Any]:
        """What `bench.faults --json` writes per fault."""
        return {
            "fault": self.fault,
            "what": self.what,
            "lost": self.lost,
            "duplicated": self.duplicates,
            "anomalies": self.anomalies,
            "history_logs": self.history_logs,
            "gap_s": self.gap_during_s,
            "recovery_s": self.recovery_s,
            "listener": self.listener,
            "result": "ok" if self.ok else f"FAILED {self.error}".strip(),
        }


def _gaps(seen: list[float], start: float, end: float) -> float:
    """The longest time between two windows becoming visible (at `seen`), from the last one
    before `start` up to the last one at or before `end` (a stall over `start` counts whole)."""
    times = sorted(seen)
    inside = [t for t in times if start <= t <= end]
    before = [t for t in times if t < start]
    window = before[-1:] + inside
    if len(window) < 2:
        return float("nan")
    return float(max(b - a for a, b in itertools.pairwise(window)))


def _latencies_ms(probe: AudioProbe, start: float, end: float) -> list[float]:
    """produced_at of a window's newest chunk -> visible, for chunks produced in [start, end)."""
    return [
        (at - chunk.source_produced_at_ms / 1000) * 1000
        for at, chunk in probe.seen
        if chunk.source_produced_at_ms and start <= chunk.source_produced_at_ms / 1000 < end
    ]


def _fresh_run(cluster: LocalCluster, fault: str, workdir: Path) -> FaultContext:
    """Fresh topics, group and log folder for one fault."""
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
    topics_file = write_topics_file(topics, logs)
    ctx = FaultContext(cluster, client, topics, topics_file, f"fm-{run}", Members(logs))
    layout = cluster.layout()
    if layout.faultable:  # member a and the talker on links of their own
        ctx.member_client = {"bootstrap.servers": layout.link_bootstrap("member")}
        ctx.talker_client = {"bootstrap.servers": layout.link_bootstrap("talker")}
    if fault == "clock-skew":
        ctx.member_env = faketime_env(logs)
    return ctx


def inject(ctx: FaultContext, fault: str, rng: random.Random) -> None:
    """One fault of the matrix (fault_actions, network_faults) into `ctx`'s cluster."""
    if fault in NETWORK_FAULT_ACTIONS:
        if not ctx.cluster.layout().faultable:
            raise LinkUsageError(f"{fault} needs a faultable cluster (--faultable)")
        NETWORK_FAULT_ACTIONS[fault](ctx, rng)
    else:
        FAULT_ACTIONS[fault](ctx)


def run_fault(
    cluster: LocalCluster,
    fault: str,
    rng: random.Random,
    engine: Any,
    workdir: Path,
    seed: int,
    inject_after_s: float = INJECT_AFTER_S,
) -> FaultRow:
    """One fault on `cluster`: fresh topics and group, two members, the live talker; the fault
    comes `inject_after_s` plus 0-8 s (seeded) after the talker started."""
    from codeclog.consumers.readers.verify import verify

    ctx = _fresh_run(cluster, fault, workdir)
    client, topics, members = ctx.client, ctx.topics, ctx.members
    probe = AudioProbe(client, topics.audio, topics.partitions)
    listener = ListenerProbe(client, topics)
    config = PublisherConfig(
        topic=topics.chunks, producer_id="faults-talker", delivery_timeout_ms=240_000
    )
    voice = Voice(ctx.talker_client or client, config, now_ms=ctx.talker_clock)
    talker = LiveTalker(voice, Speech(SESSIONS_PER_ROUND, ROUND_S, seed), repeat=True)
    error = ""
    fault_at = fault_end = talk_start = time.time()
    delay = 0.0
    try:
        ctx.start_member("a")
        ctx.start_member("b")
        for name in ("a", "b"):
            members.wait_for_log(members.latest[name], READY_LINE, MEMBER_READY_S)
        probe.start()
        listener.start()
        talk_start = time.time()
        talker.start()
        delay = rng.uniform(inject_after_s, inject_after_s + 8.0)
        time.sleep(delay)
        fault_at = time.time()
        inject(ctx, fault, rng)
        fault_end = time.time()
        time.sleep(AFTER_FAULT_S)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        talker.stop(ROUND_S * 3)
    voice.close(TALKER_CLOSE_S)
    if talker.error is not None:
        error = error or f"talker: {talker.error}"
    with_nodes_up(cluster)
    error = error or wait_group_drained(client, ctx.group, topics.chunks, DRAIN_S)
    crashed = members.crashed()
    members.stop_all(MEMBER_STOP_S)
    probe.stop()
    listener.stop()
    report = verify(client, topics, engine)
    checked: AuditReport = audit(client, topics.audio, topics.dlq)
    history, history_logs = check_history(ctx)
    matches = (
        len(checked.windows) == report.expected_windows
        and not report.missing
        and not report.unexpected
        and not report.mismatched
    )
    warm = talk_start + WARM_S
    seen = [at for at, _ in probe.seen]
    if error:
        (members.logs / "members.txt").write_text(members.tail())
    return FaultRow(
        fault=fault,
        what="; ".join(ctx.notes) or "(not injected)",
        injected_after_s=round(delay, 1),
        talker_records=voice.records,
        talker_lost=voice.failed,
        verify_ok=report.ok,
        expected_windows=report.expected_windows,
        missing=len(report.missing),
        duplicated=len(report.duplicated),
        mismatched=len(report.mismatched),
        audit=checked.summary(),
        audit_matches_verify=matches,
        listener=listener.check(checked.windows),
        dead_letters=checked.dead_letters,
        gap_before_s=_gaps(seen, warm, fault_at),
        gap_during_s=_gaps(seen, fault_at, time.time()),  # until drained
        p99_before_ms=percentile(_latencies_ms(probe, warm, fault_at), 99),
        p99_during_ms=percentile(_latencies_ms(probe, fault_at, fault_end + AFTER_FAULT_S), 99),
        member_exits=list(dict.fromkeys(crashed + members.exits)),
        anomalies={kind: len(items) for kind, items in history.items()},
        examples=[item for items in history.values() for item in items[:2]],
        history_logs=history_logs,
        recovery_s=_recovery(seen, fault_end),
        error=error,
    )


def check_history(ctx: FaultContext) -> tuple[dict[str, list[str]], str]:
    """The independent history check (codeclog.devtools.history) of the run, with the fate of
    every transactional batch read from its partition leader's log segments, and the line
    saying which logs those were. It never stops the matrix: a checker that fails is a finding
    of its own kind (CHECKER_FAILED) in this fault's row."""
    t = ctx.topics
    try:
        nodes = ctx.cluster.layout().node_ids
        log_dirs = {node: ctx.cluster.node(node).log_dirs for node in nodes}
        found = read_history(
            ctx.client, HistoryTopics(t.chunks, t.audio, t.dlq, t.progress), ctx.group, log_dirs
        )
        return check(found), describe_logs(found.logs)
    except Exception as exc:
        return {CHECKER_FAILED: [f"{type(exc).__name__}: {exc}"]}, "not read: the checker failed"


def _recovery(seen: list[float], fault_end: float) -> float:
    """From the fault's end to the first window visible after it."""
    after = [at for at in seen if at >= fault_end]
    return float(min(after) - fault_end) if after else float("nan")


def fault_table(rows: list[FaultRow]) -> str:
    lines = [
        "| fault | what happened | lost | duplicated | anomalies | audio gap before / from the "
        "fault | recovery | chunk latency p99 before / during | speculative listener | result |",
        "|---|---|---:|---:|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        exits = f"; members: {', '.join(r.member_exits)}" if r.member_exits else ""
        anomalies = ", ".join(f"{k} {n}" for k, n in r.anomalies.items() if n) or "0"
        result = "ok" if r.ok else f"FAILED {r.error}".strip()
        lines.append(
            f"| {r.fault} | {r.what}{exits} | {r.lost} | {r.duplicates} | {anomalies} "
            f"| {r.gap_before_s:.1f} s / {r.gap_during_s:.1f} s | {r.recovery_s:.1f} s "
            f"| {r.p99_before_ms:.0f} / {r.p99_during_ms:.0f} ms | {_heard(r.listener)} "
            f"| {result} |"
        )
    return "\n".join(lines)


def _heard(listener: dict[str, int]) -> str:
    """The speculative listener's cell: windows played (of them heard live), and what was
    wrong (played twice, missed, beyond or unlike the committed copy, unconfirmed)."""
    if not listener:
        return "-"
    wrong = [k for k in ("twice", "missed", "beyond_committed", "other_bytes", "unconfirmed")
             if listener.get(k)]  # fmt: skip
    detail = ", ".join(f"{k} {listener[k]}" for k in wrong) or "each once, confirmed"
    return f"{listener['played']} ({listener['heard_live']} live): {detail}"
