"""Exactly once on a real 3-node cluster: the talker and the vocoder through node faults.

One module-local LocalCluster (three KRaft nodes, RF 3, min ISR 2) under a temp dir, never the
session broker; each test has its own topics and group. First test: the codeclog talker
(`ChunkPublisher`, idempotent, acks=all) keeps publishing
synthetic sessions while `VocoderService` (transactional, read_committed, tiny engine) runs in
a thread; mid-run the leader of chunk partition 0 is SIGKILLed, more sessions are published
while it is down, and the node is restarted. Then: the talker reports every record delivered,
the chunk topic holds exactly the records published (no loss, no producer duplicate), and
`verify` finds every expected audio window exactly once and byte-identical. Then the reduced
fault matrix (codeclog.devtools.faults, which `python -m bench.faults` runs whole): two
`codeclog vocode` members and a realtime talker through a member SIGKILLed during a leader
failover, and through a delayed write, with a speculative listener following the audio. Last,
the tools themselves: `broker status` with Toxiproxy killed, and the history checker reading a
complete log while node 1 is down.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from codeclog.devtools.broker import BrokerSettings
from codeclog.devtools.cluster import LocalCluster, NodeStatusKind
from codeclog.devtools.fault_actions import current_leader
from codeclog.devtools.talker import Speech, Voice
from codeclog.kafka.topics import create_topics
from codeclog.producers.publisher import PublisherConfig
from codeclog.topics_config import TopicsConfig

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.vocoder]

PARTITIONS = 2
CATCH_UP_TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for this module's tests (each test uses its own topics and group)."""
    settings = BrokerSettings(
        heap_min_mb=128,
        heap_max_mb=512,
        start_timeout_s=180,  # three cold JVMs on two shared cores
        die_with_parent=True,  # a killed test session leaves no JVM behind
        extra_jvm_args=("-XX:TieredStopAtLevel=1",),  # as the session broker: cheaper start
    )
    # faultable: every link through Toxiproxy, for the network fault below (process faults
    # and the in-process test run the same through the proxies)
    local = LocalCluster(tmp_path_factory.mktemp("cluster"), 3, settings, faultable=True)
    try:
        local.start()
        yield local
    finally:
        local.stop()


def _wait(
    condition: Callable[[], bool],
    timeout_s: float,
    what: str,
    state: Callable[[], object] = lambda: "",
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s {state()}"
        time.sleep(0.25)


def _ends_and_commits(
    client: dict[str, str], topic: str, group: str
) -> tuple[list[int], list[int]]:
    consumer = Consumer({**client, "group.id": group, "enable.auto.commit": False})
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
        commits = [tp.offset for tp in consumer.committed(parts, timeout=10)]
        return ends, commits
    finally:
        consumer.close()


def _stack_of(thread: threading.Thread) -> str:
    """The stack of `thread` and of every codeclog helper thread (bounded calls, commits)."""
    frames = sys._current_frames()
    lines = []
    for other in threading.enumerate():
        if other is thread or other.name.startswith("codeclog"):
            frame = frames.get(other.ident or 0)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "(none)"
            lines.append(f"--- {other.name}\n{stack}")
    return "\n".join(lines)


def test_leader_sigkill_and_restart_mid_run_lose_and_duplicate_nothing(
    cluster: LocalCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="codeclog.vocode")
    caplog.set_level(logging.WARNING, logger="codeclog.kafka")
    pytest.importorskip("torch")
    from codeclog.consumers.member.service import VocodeConfig, VocoderService
    from codeclog.consumers.readers.verify import verify
    from codeclog.vocoder.engine import Code2WavEngine

    engine: Any = Code2WavEngine.from_spec("tiny")
    client = {"bootstrap.servers": cluster.bootstrap}
    topics = TopicsConfig(
        chunks="f.chunks", audio="f.audio", dlq="f.dlq", progress="f.progress", partitions=2
    )
    outcomes = create_topics(client, topics)
    assert {(o.replication_factor, o.min_insync_replicas, o.brokers) for o in outcomes} == {
        (3, 2, 3)
    }

    service = VocoderService(
        client, topics, VocodeConfig(group="fault-vocoder", max_records=8), engine
    )
    codes: list[int] = []

    def run() -> None:
        service.run()  # raises what ends the member: then `codes` stays empty
        codes.append(0)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    # the codeclog talker over one ChunkPublisher that lives through the whole fault
    config = PublisherConfig(
        topic=topics.chunks, producer_id="fault-talker", delivery_timeout_ms=60_000
    )
    talker = Voice(client, config)
    try:
        talker.speak(Speech(sessions=3, seconds=4, seed=21), realtime=False)
        assert talker.publisher.flush(60) == 0
        _wait(lambda: service.stats["windows"] > 0, 120, "the vocoder's first audio")

        victim = current_leader(client, topics.chunks, 0)
        cluster.kill(victim)  # SIGKILL, mid-run: the vocoder is still working through phase 1
        assert {s.node_id: s.kind for s in cluster.status()}[victim] is NodeStatusKind.CRASHED
        talker.speak(Speech(sessions=3, seconds=4, seed=22), realtime=False)  # still speaking
        _wait(
            lambda: current_leader(client, topics.chunks, 0) not in (victim, -1),
            60,
            "a new leader for chunk partition 0",
        )
        cluster.restart(victim)
        talker.speak(Speech(sessions=3, seconds=4, seed=23), realtime=False)
        report = talker.close(60)
        assert report.undelivered == 0 and report.failed == 0, report
        assert talker.publisher.stats.failed == 0

        def caught_up() -> bool:
            try:
                ends, commits = _ends_and_commits(client, topics.chunks, "fault-vocoder")
            except KafkaException:  # a partition without a reachable leader for now
                return False
            return commits == ends

        # A stall here was the paused-partition bug (a partition lost while a decode had it
        # paused came back paused for good; consumers/member/service.py `_resume_paused`).
        _wait(
            caught_up,
            CATCH_UP_TIMEOUT_S,
            "the vocoder catching up",
            lambda: (service.stats, _stack_of(runner), caplog.text[-6000:]),
        )
    finally:
        service.stop()
        runner.join(60)
    assert codes == [0]

    ends, _ = _ends_and_commits(client, topics.chunks, "fault-vocoder")
    assert sum(ends) == talker.records  # idempotent: every record once, none twice
    result = verify(client, topics, engine)
    assert result.ok, result.to_dict()
    assert result.expected_windows == result.actual_windows > 0
    assert result.requests >= 6 and result.expected_windows >= 20
    assert not result.dead_letters


# The reduced fault matrix (the full one: python -m bench.faults, figures in BENCHMARKS.md), a few
# minutes each on the 2-core box: a member SIGKILLed during a leader failover (a leader
# failover, a member's restart that finds its transaction open, a rebalance), and the delayed
# write (member a's link to an audio leader holds its requests past the member's call timeout;
# the independent history checker judges the outputs). The first test above covers a leader's
# SIGKILL with the service in-process.
CI_FAULTS = ("member", "delayed-write")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("fault", CI_FAULTS)
def test_fault_matrix_loses_and_duplicates_nothing(
    cluster: LocalCluster, tmp_path: Path, fault: str
) -> None:
    pytest.importorskip("torch")
    import random

    from codeclog.devtools.faults import fault_table, run_fault
    from codeclog.vocoder.engine import Code2WavEngine

    engine: Any = Code2WavEngine.from_spec("tiny")
    rng = random.Random(19)
    row = run_fault(cluster, fault, rng, engine, tmp_path, seed=19, inject_after_s=6.0)
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in tmp_path.rglob("vocode-*.log"))
    assert not row.error, (fault_table([row]), logs)
    assert row.talker_lost == 0 and row.talker_records > 0, fault_table([row])
    assert row.verify_ok and row.missing == row.duplicated == row.mismatched == 0, row
    assert row.expected_windows > 0 and row.audit["windows"] == row.expected_windows, row
    assert row.audit["ok"] and row.audit_matches_verify, row
    assert row.dead_letters == 0, row
    assert not any(row.anomalies.values()), (row.anomalies, row.examples)
    assert row.what != "(not injected)", row
    # a speculative listener through the fault: every committed window once, its bytes, each
    # confirmed, nothing the committed copy lacks, most of them heard from the live copy
    listener = row.listener
    assert listener["ok"] and listener["played"] == row.expected_windows, listener
    assert listener["heard_live"] > 0, listener


def test_status_calls_a_cluster_behind_a_dead_toxiproxy_unreachable(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    from codeclog.cli import main

    where = ["broker", "status", "--data-dir", str(cluster.data_dir)]
    pid = cluster.toxiproxy().running_pid()
    assert pid is not None and main(where) == 0
    capsys.readouterr()
    try:
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: cluster.toxiproxy().running_pid() is None, 10, "Toxiproxy gone")
        code, out = main(where), capsys.readouterr().out
        assert code == 1 and "UNREACHABLE: Toxiproxy is not running" in out, out
        nodes = [line.split()[1] for line in out.splitlines() if line[:1].isdigit()]
        assert nodes == ["running"] * 3  # the nodes themselves still run
    finally:
        cluster.start()  # Toxiproxy and its proxies back
    assert main(where) == 0


def test_the_history_checker_reads_a_complete_log_while_node_1_is_down(
    cluster: LocalCluster, unique_name: Callable[[str], str]
) -> None:
    """A transaction whose data reached node 1 and whose COMMIT did not (node 1 killed
    between the two): node 1's log says open, the leader's says committed; the checker reads
    the leader's, complete to the high watermark."""
    from codeclog.devtools.fault_actions import leader_of, transaction_state_partition
    from codeclog.devtools.log_segments import (
        COMMIT,
        OPEN,
        Locator,
        fates,
        partition_batches,
        read_log,
    )

    client = {"bootstrap.servers": cluster.bootstrap}
    topic = unique_name("h.audio")
    admin = AdminClient({**client, "log_level": "2"})
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[2, 3, 1]])])[topic].result(30)
    _wait(lambda: current_leader(client, topic, 0) == 2, 30, "node 2 leading the new partition")
    warm = Producer({**client, "transactional.id": unique_name("warm"), "log_level": 2})
    warm.init_transactions(60)  # the transaction state topic exists from here on
    tid = next(
        t
        for t in (unique_name("txn") for _ in range(50))
        if leader_of(client, "__transaction_state", transaction_state_partition(t)) != 1
    )  # a coordinator that stays up
    producer = Producer({**client, "transactional.id": tid, "log_level": 2})
    producer.init_transactions(60)
    producer.begin_transaction()
    for value in (b"a", b"b", b"c"):
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0  # acks=all: on every replica, node 1's included
    log_dirs = {n: cluster.node(n).log_dirs for n in cluster.layout().node_ids}
    try:
        cluster.kill(1)
        producer.commit_transaction(120)  # once node 1 has left the ISR
        assert fates(partition_batches(log_dirs[1], topic, 0)) == {0: OPEN, 1: OPEN, 2: OPEN}
        with Locator(client) as locate:
            # commit_transaction returns once the coordinator has decided; the markers are
            # written after, and the high watermark passes the leader's only once node 3 has
            # it too (CI read end 4, high watermark 3)
            _wait(lambda: locate(topic, 0)[1] == 4, 30, "the commit marker under the watermark")
            log, found = read_log(log_dirs, topic, 0, locate)
        assert log.node == 2 and log.complete and log.high_watermark == 4, log
        assert found == {0: COMMIT, 1: COMMIT, 2: COMMIT}
    finally:
        cluster.start()  # node 1 back for whatever runs next
        admin.delete_topics([topic])
