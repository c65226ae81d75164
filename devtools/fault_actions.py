"""The faults of the fault matrix, each injected into a local 3-node cluster mid-run:

leader       kill -9 the leader of chunk partition 0, restart it
coordinator  kill -9 the transaction coordinator of member a's transactional id, restart it
pause        SIGSTOP the leader of chunk partition 0 for 20 s, then SIGCONT
rolling      a rolling restart of all three nodes (SIGTERM, start, next)
down         the whole cluster down (kill -9 all three) for 15 s, then started again
member       kill -9 the leader of chunk partition 0 and, 1 s later, member a; both come back
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka.admin import AdminClient

from codeclog.devtools.cluster import LocalCluster, NodeStatusKind
from codeclog.devtools.members import Members
from codeclog.topics_config import TopicsConfig

FAULTS = ("leader", "coordinator", "pause", "rolling", "down", "member")
PAUSE_S = 20.0
DOWN_S = 15.0
MEMBER_OUTAGE_S = 300  # --outage-timeout of the members
TRANSACTION_STATE_PARTITIONS = 3  # codeclog.devtools.cluster_layout.INTERNAL_PARTITIONS


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


def current_leader(client: dict[str, str], topic: str, partition: int) -> int:
    """The partition's leader as the answering node knows it; -1 while it has none, or does not
    list the partition yet (asked right after creating the topic: a CI run found it without
    partitions)."""
    metadata = AdminClient({**client, "log_level": "2"}).list_topics(topic, timeout=10)
    found = metadata.topics.get(topic)
    listed = found.partitions.get(partition) if found is not None else None
    return -1 if listed is None else int(listed.leader)


def leader_of(client: dict[str, str], topic: str, partition: int) -> int:
    deadline = time.monotonic() + 60
    while True:
        try:
            leader = current_leader(client, topic, partition)
            if leader >= 0:
                return leader
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise RuntimeError(f"no leader for {topic}[{partition}] within 60 s")
        time.sleep(0.5)


@dataclasses.dataclass
class FaultContext:
    cluster: LocalCluster
    client: dict[str, str]
    topics: TopicsConfig
    topics_file: Path
    group: str
    members: Members
    notes: list[str] = dataclasses.field(default_factory=list)
    # On a faultable cluster member a and the talker have links of their own (devtools.links)
    member_client: dict[str, str] = dataclasses.field(default_factory=dict)
    talker_client: dict[str, str] = dataclasses.field(default_factory=dict)
    member_env: dict[str, str] = dataclasses.field(default_factory=dict)  # member a's
    talker_clock: SkewedClock = dataclasses.field(default_factory=lambda: SkewedClock())
    # more `codeclog vocode` options per member, kept across restarts (the soak's metrics port)
    member_args: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def start_member(self, name: str) -> None:
        client = self.member_client if name == "a" and self.member_client else self.client
        self.members.start(
            name,
            "--bootstrap",
            client["bootstrap.servers"],
            "--topics-config",
            str(self.topics_file),
            "--group",
            self.group,
            "--stop-timeout",
            "60",
            # the whole cluster down takes ~75 s here (15 s + a cold start): past the 60 s default
            "--outage-timeout",
            str(MEMBER_OUTAGE_S),
            *self.member_args.get(name, ()),
            env=self.member_env if name == "a" else None,
        )

    def restart(self, node: int) -> float:
        started = time.monotonic()
        self.cluster.restart(node)
        return time.monotonic() - started


@dataclasses.dataclass
class SkewedClock:
    """The talker's wall clock in ms, `offset_ms` off the real one (the clock-skew fault)."""

    offset_ms: int = 0

    def __call__(self) -> int:
        return int(time.time() * 1000) + self.offset_ms


def fault_leader(ctx: FaultContext) -> None:
    victim = leader_of(ctx.client, ctx.topics.chunks, 0)
    ctx.cluster.kill(victim)
    time.sleep(5.0)
    ctx.notes.append(
        f"node {victim} (leader of chunks[0]) SIGKILL; back in {ctx.restart(victim):.0f} s"
    )


def fault_coordinator(ctx: FaultContext) -> None:
    tid = f"{ctx.group}-a"
    victim = leader_of(ctx.client, "__transaction_state", transaction_state_partition(tid))
    ctx.cluster.kill(victim)
    time.sleep(5.0)
    ctx.notes.append(
        f"node {victim} (transaction coordinator of {tid}) SIGKILL; back in "
        f"{ctx.restart(victim):.0f} s"
    )


def fault_pause(ctx: FaultContext) -> None:
    victim = leader_of(ctx.client, ctx.topics.chunks, 0)
    ctx.cluster.pause(victim)
    time.sleep(PAUSE_S)
    ctx.cluster.resume(victim)
    ctx.notes.append(f"node {victim} (leader of chunks[0]) SIGSTOP {PAUSE_S:.0f} s, SIGCONT")


def fault_rolling(ctx: FaultContext) -> None:
    took = [f"{ctx.restart(node):.0f}" for node in ctx.cluster.layout().node_ids]
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
    ctx.members.kill(ctx.members.latest["a"])
    time.sleep(4.0)
    back = ctx.restart(victim)
    ctx.start_member("a")
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


def with_nodes_up(cluster: LocalCluster) -> None:
    """Every node running and unpaused (a fault that failed half-way leaves none behind)."""
    for status in cluster.status():
        if status.kind is NodeStatusKind.PAUSED:
            cluster.resume(status.node_id)
    cluster.start()
