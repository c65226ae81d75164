"""The network faults of the fault matrix, injected through a faultable cluster's links
(codeclog.devtools.links), each on a schedule drawn from the run's seeded random generator:

delayed-write          member a's link to the leader of audio partition 0 holds every byte
                       longer than the member's call timeout (12-18 s) for 30 s: the step's
                       commit times out, is aborted and redone, and the held bytes land while
                       the next transaction is open
txn-coordinator-cut    member a cannot reach its transaction coordinator (the nodes can) for 30 s
group-coordinator-cut  member a cannot reach its group coordinator for 20-25 s, past its session
                       timeout, while it keeps decoding: its partitions move to member b
leader-isolated        the leader of chunk partition 0 is cut from the other nodes (its peers
                       link: their replication fetches and Raft requests to it) for 30 s,
                       while clients still reach it
slow-links             every link of every node 200-1000 ms of latency (600 +- 400) for 60 s
resets                 for 60 s, every 2-5 s a random node's random link resets its connections
                       for 1-3 s
talker-cut             the talker cannot reach the cluster for 30 s
clock-skew             the talker's clock 10 minutes ahead for 15 s, then 10 minutes behind for
                       15 s; member a's clock (libfaketime) jumps 10 minutes ahead, then back
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from codeclog.devtools.fault_actions import (
    TRANSACTION_STATE_PARTITIONS,
    FaultContext,
    java_string_hash,
    leader_of,
    transaction_state_partition,
)
from codeclog.devtools.links import DOWN, HEAL, LINKS, RESET, Fault, latency

NETWORK_FAULTS = (
    "delayed-write",
    "txn-coordinator-cut",
    "group-coordinator-cut",
    "leader-isolated",
    "slow-links",
    "resets",
    "talker-cut",
    "clock-skew",
)
CUT_S = 30.0
SLOW_S = 60.0
SKEW_MS = 10 * 60 * 1000
SKEW_S = 15.0
FAKETIME_LIBRARY = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
GROUP_STATE_PARTITIONS = TRANSACTION_STATE_PARTITIONS  # offsets.topic.num.partitions, the same


def group_coordinator_partition(group: str) -> int:
    """The broker's GroupCoordinator.partitionFor: Utils.abs(hashCode) % partitions."""
    return (java_string_hash(group) & 0x7FFFFFFF) % GROUP_STATE_PARTITIONS


def _for(ctx: FaultContext, node: int, link: str, fault: Fault, seconds: float) -> None:
    """`fault` on one node's link for `seconds`, then healed (also when interrupted)."""
    ctx.cluster.net(node, link, fault)
    try:
        time.sleep(seconds)
    finally:
        ctx.cluster.net(node, link, HEAL)


def delayed_write(ctx: FaultContext, rng: random.Random) -> None:
    node = leader_of(ctx.client, ctx.topics.audio, 0)
    hold_ms = rng.randint(12_000, 18_000)
    _for(ctx, node, "member", latency(hold_ms), CUT_S)
    ctx.notes.append(
        f"member a's link to node {node} (leader of audio[0]) held {hold_ms} ms for {CUT_S:.0f} s"
    )


def txn_coordinator_cut(ctx: FaultContext, rng: random.Random) -> None:
    tid = f"{ctx.group}-a"
    node = leader_of(ctx.client, "__transaction_state", transaction_state_partition(tid))
    _for(ctx, node, "member", DOWN, CUT_S)
    ctx.notes.append(f"member a cut from node {node} (its transaction coordinator) {CUT_S:.0f} s")


def group_coordinator_cut(ctx: FaultContext, rng: random.Random) -> None:
    node = leader_of(ctx.client, "__consumer_offsets", group_coordinator_partition(ctx.group))
    seconds = rng.uniform(20.0, 25.0)
    _for(ctx, node, "member", DOWN, seconds)
    ctx.notes.append(
        f"member a cut from node {node} (its group coordinator) {seconds:.0f} s, past its "
        "10 s session"
    )


def leader_isolated(ctx: FaultContext, rng: random.Random) -> None:
    node = leader_of(ctx.client, ctx.topics.chunks, 0)
    _for(ctx, node, "peers", DOWN, CUT_S)
    ctx.notes.append(f"node {node} (leader of chunks[0]) cut from its peers {CUT_S:.0f} s")


def slow_links(ctx: FaultContext, rng: random.Random) -> None:
    nodes = list(ctx.cluster.layout().node_ids)
    slow = latency(600, 400)
    try:
        for node in nodes:
            for link in LINKS:
                ctx.cluster.net(node, link, slow)
        time.sleep(SLOW_S)
    finally:
        ctx.cluster.heal_all()
    ctx.notes.append(f"every link 200-1000 ms for {SLOW_S:.0f} s")


def resets(ctx: FaultContext, rng: random.Random) -> None:
    nodes = list(ctx.cluster.layout().node_ids)
    until, count = time.monotonic() + SLOW_S, 0
    try:
        while time.monotonic() < until:
            node, link = rng.choice(nodes), rng.choice(LINKS)
            _for(ctx, node, link, RESET, rng.uniform(1.0, 3.0))
            count += 1
            time.sleep(rng.uniform(2.0, 5.0))
    finally:
        ctx.cluster.heal_all()
    ctx.notes.append(f"{count} links reset at random over {SLOW_S:.0f} s")


def talker_cut(ctx: FaultContext, rng: random.Random) -> None:
    nodes = list(ctx.cluster.layout().node_ids)
    try:
        for node in nodes:
            ctx.cluster.net(node, "talker", DOWN)
        time.sleep(CUT_S)
    finally:
        for node in nodes:
            ctx.cluster.net(node, "talker", HEAL)
    ctx.notes.append(f"the talker cut from every node {CUT_S:.0f} s")


def clock_skew(ctx: FaultContext, rng: random.Random) -> None:
    member_file = (
        Path(ctx.member_env.get("FAKETIME_TIMESTAMP_FILE", "")) if ctx.member_env else None
    )
    try:
        for offset_ms in (SKEW_MS, -SKEW_MS):
            ctx.talker_clock.offset_ms = offset_ms
            if member_file is not None:
                member_file.write_text(f"{offset_ms // 1000:+d}\n")
            time.sleep(SKEW_S)
    finally:
        ctx.talker_clock.offset_ms = 0
        if member_file is not None:
            member_file.write_text("+0\n")
    member = "member a's clock jumped the same way" if member_file else "member a not skewed"
    ctx.notes.append(f"talker clock +10 min {SKEW_S:.0f} s, then -10 min; {member}")


def faketime_env(folder: Path) -> dict[str, str]:
    """libfaketime for member a, its offset read from a file at every clock read (the
    monotonic clock left alone: timeouts stay real); {} when libfaketime is not installed."""
    if not FAKETIME_LIBRARY.exists() and shutil.which("faketime") is None:
        return {}
    offset = folder / "faketime-offset"
    offset.write_text("+0\n")
    return {
        "LD_PRELOAD": str(FAKETIME_LIBRARY),
        "FAKETIME_TIMESTAMP_FILE": str(offset),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


NETWORK_FAULT_ACTIONS: dict[str, Callable[[FaultContext, random.Random], None]] = {
    "delayed-write": delayed_write,
    "txn-coordinator-cut": txn_coordinator_cut,
    "group-coordinator-cut": group_coordinator_cut,
    "leader-isolated": leader_isolated,
    "slow-links": slow_links,
    "resets": resets,
    "talker-cut": talker_cut,
    "clock-skew": clock_skew,
}
