"""Lag monitoring on the real local broker: STOP, recovery, REWIND, transactional LSO, exporter,
partitions without commits, groups that never started or do not exist.

The consumer under watch is a plain confluent-kafka consumer committing offsets on a chunk topic
filled with CodecChunk records (schemas.wire, 25 new frames = 1 s of audio each). The monitor's
clock is injected: samples are taken back to back but stamped STEP_MS apart, so a window that
would need a minute of wall time takes a second.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

import codeclog.cli as cli
from codeclog.kafka.topics import create_topics
from codeclog.lag.evaluator import EvaluatorConfig, GroupRule, GroupStatus, PartitionStatus, Rule
from codeclog.lag.exporter import LagCollector, sample_all, serve
from codeclog.lag.measure import LagMeasurer
from codeclog.lag.monitor import LagMonitor
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk
from tests.topics import fresh_topics

pytestmark = pytest.mark.kafka

STEP_MS = 10_000
CHUNK_FRAMES = 25
CONFIG = EvaluatorConfig(
    window_samples=4, stuck_after_ms=25_000, warn_growth_records=5, warn_min_samples=3
)


def chunk_value(seq: int) -> bytes:
    codes = tuple(range(CHUNK_FRAMES + 3))
    chunk = CodecChunk(
        "req-1",
        codes,
        chunk_seq=seq,
        codec_chunk_frames=CHUNK_FRAMES,
        codec_left_context_frames=3 if seq else 0,
    )
    return wire.encode(chunk)


@pytest.fixture
def topic(new_topic: Callable[..., str]) -> str:
    return new_topic("lag-chunks")


def produce(bootstrap: str, topic: str, first_seq: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for seq in range(first_seq, first_seq + count):
        producer.produce(topic, chunk_value(seq), key=b"req-1", partition=0)
    assert producer.flush(10) == 0


def consume_all(
    bootstrap: str, topic: str, group: str, expected: int, step_over_markers: bool = True
) -> Consumer:
    """A subscribed consumer that has read `expected` records and committed its position."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    read, deadline = 0, time.monotonic() + 30
    while read < expected and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            read += 1
    assert read == expected
    if step_over_markers:
        _step_over_markers(consumer, deadline)
    positions = consumer.position(consumer.assignment())
    consumer.commit(offsets=positions, asynchronous=False)  # position(), never offset() + 1
    return consumer


def caught_up(bootstrap: str, topic: str, group: str, records: int) -> None:
    """`records` chunks produced, then read and committed by `group`, whose consumer left."""
    produce(bootstrap, topic, 0, records)
    consume_all(bootstrap, topic, group, records).close()


def _step_over_markers(consumer: Consumer, deadline: float) -> None:
    """Poll until position() reaches the LSO: the fetcher skips a trailing commit marker only
    when it fetches it, so right after the last record position() may still point at it."""
    for tp in consumer.assignment():
        _low, lso = consumer.get_watermark_offsets(tp, timeout=10)  # read_committed: the LSO
        while consumer.position([tp])[0].offset < lso and time.monotonic() < deadline:
            assert consumer.poll(0.1) is None


class Clock:
    """The injected clock: starts at the wall clock, advances only when told."""

    def __init__(self) -> None:
        self.now_ms = int(time.time() * 1000)

    def tick(self) -> int:
        self.now_ms += STEP_MS
        return self.now_ms


def test_stopped_consumer_turns_stop_with_rising_lags_then_recovers(
    kafka_bootstrap: str, topic: str, unique_name: Callable[[str], str]
) -> None:
    group = unique_name("lag-group")
    produce(kafka_bootstrap, topic, 0, 10)
    consumer = consume_all(kafka_bootstrap, topic, group, 10)
    monitor = LagMonitor({"bootstrap.servers": kafka_bootstrap}, group, topic, config=CONFIG)
    clock = Clock()
    try:
        live = monitor.sample(clock.now_ms)
        assert live.status is GroupStatus.OK and live.member_count == 1
        assert live.partition(0).lag == 0 and live.partition(0).owned is True
        consumer.close()  # the consumer stops: it leaves the group, the talker keeps producing
        reports = []
        for step in range(5):
            produce(kafka_bootstrap, topic, 10 + 3 * step, 3)
            reports.append(monitor.sample(clock.tick()))
        rows = [r.partition(0) for r in reports]
        assert [r.lag for r in rows] == [3, 6, 9, 12, 15]  # recomputed at every sample
        times = [r.time_lag_s or 0.0 for r in rows]
        audio = [r.audio_lag_s for r in rows]
        assert all(r.time_lag_s is not None for r in rows) and times == sorted(times)
        assert times[-1] - times[0] >= 3.5 * STEP_MS / 1000  # rising with the clock
        assert audio == pytest.approx([3.0, 6.0, 9.0, 12.0, 15.0])  # 1 s of audio per chunk
        # caught up one sample ago, but the window is young and the oldest chunk is already
        # 10 s old (the injected clock): the absolute rule sees the stop before STOP can
        assert rows[0].rule is Rule.TIME_LAG_ABOVE and rows[0].status is PartitionStatus.LAGGING
        assert reports[0].rules == (GroupRule.EMPTY_WITH_LAG,)
        assert rows[-1].status is PartitionStatus.STOP and rows[-1].owned is False
        assert reports[-1].status is GroupStatus.ERR
        assert reports[-1].member_count == 0 and reports[-1].state == "EMPTY"

        resumed = consume_all(kafka_bootstrap, topic, group, 15)
        try:
            back = monitor.sample(clock.tick())
        finally:
            resumed.close()
        assert back.partition(0).lag == 0
        assert back.partition(0).rule is Rule.WITHIN_ALLOWED_LAG
        assert back.status is GroupStatus.OK
    finally:
        monitor.close()


def test_offset_reset_backwards_is_rewind(
    kafka_bootstrap: str, topic: str, unique_name: Callable[[str], str]
) -> None:
    group = unique_name("lag-group")
    caught_up(kafka_bootstrap, topic, group, 20)
    monitor = LagMonitor({"bootstrap.servers": kafka_bootstrap}, group, topic, config=CONFIG)
    clock = Clock()
    try:
        assert monitor.sample(clock.now_ms).status is GroupStatus.OK
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        reset = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 5)])
        admin.alter_consumer_group_offsets([reset])[group].result(30)  # like --reset-offsets
        report = monitor.sample(clock.tick())
    finally:
        monitor.close()
    row = report.partition(0)
    assert (row.committed_offset, row.lag) == (5, 15)
    assert row.status is PartitionStatus.REWIND
    assert report.status is GroupStatus.ERR


@pytest.mark.parametrize(
    ("step_over_markers", "committed"),
    [(True, 12), (False, 11)],
    ids=["position_past_the_marker", "position_still_at_the_marker"],
)
def test_fully_consumed_transactional_topic_has_lag_zero(
    kafka_bootstrap: str,
    topic: str,
    unique_name: Callable[[str], str],
    step_over_markers: bool,
    committed: int,
) -> None:
    group = unique_name("lag-group")
    producer = Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": unique_name("lag-txn")}
    )
    producer.init_transactions(30)
    for batch in range(2):  # two committed transactions: 10 records and 2 commit markers
        producer.begin_transaction()
        for seq in range(5):
            producer.produce(topic, chunk_value(5 * batch + seq), key=b"req-1", partition=0)
        producer.commit_transaction(30)
    consume_all(kafka_bootstrap, topic, group, 10, step_over_markers).close()
    open_txn = Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": unique_name("lag-open")}
    )
    open_txn.init_transactions(30)
    open_txn.begin_transaction()  # an open transaction: past the LSO, invisible to the vocoder
    for seq in range(3):
        open_txn.produce(topic, chunk_value(10 + seq), key=b"req-1", partition=0)
    open_txn.flush(10)
    monitor = LagMonitor({"bootstrap.servers": kafka_bootstrap}, group, topic, config=CONFIG)
    try:
        report = monitor.sample(int(time.time() * 1000))
    finally:
        monitor.close()
        open_txn.abort_transaction(30)
    row = report.partition(0)
    high_watermark = _high_watermark(kafka_bootstrap, topic)
    # records at 0-4 and 6-10, commit markers at 5 and 11; position() is 11 until the
    # consumer's next fetch steps over the last marker
    assert row.committed_offset == committed
    assert row.end_offset == 12
    assert high_watermark > row.end_offset  # the open transaction is above the LSO
    assert (row.lag, row.time_lag_s, row.audio_lag_s) == (0, 0.0, 0.0)
    assert row.from_reset is False
    assert report.status is GroupStatus.OK and report.rules == () and report.drained


def _high_watermark(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"hwm-{uuid.uuid4().hex}"})
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    return int(high)


def test_exporter_serves_lag_metrics(
    kafka_bootstrap: str, topic: str, unique_name: Callable[[str], str]
) -> None:
    group = unique_name("lag-group")
    caught_up(kafka_bootstrap, topic, group, 4)
    produce(kafka_bootstrap, topic, 4, 2)  # two chunks (2 s of audio) not yet consumed
    monitor = LagMonitor({"bootstrap.servers": kafka_bootstrap}, group, topic, config=CONFIG)
    collector = LagCollector("test")
    port = serve(collector, 0, "127.0.0.1")
    try:
        sample_all([monitor], collector, int(time.time() * 1000), lambda line: None)
    finally:
        monitor.close()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    labels = f'cluster_name="test",group="{group}",partition="0",topic="{topic}"'
    assert f"kafka_consumergroup_group_lag{{{labels}}} 2.0" in text
    assert f"codeclog_audio_lag_seconds{{{labels}}} 2.0" in text
    group_labels = f'cluster_name="test",group="{group}"'
    # the consumer left with two chunks waiting: an empty group with lag is never OK
    assert f'codeclog_group_status{{{group_labels},status="ERR"}} 1.0' in text
    assert f'codeclog_group_rule{{{group_labels},rule="empty_with_lag"}} 1.0' in text
    assert "NaN" not in text


def test_lag_command_json(
    kafka_bootstrap: str,
    topic: str,
    unique_name: Callable[[str], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    group = unique_name("lag-group")
    caught_up(kafka_bootstrap, topic, group, 3)
    argv = ["lag", "--bootstrap", kafka_bootstrap, "--group", group, "--topic", topic]
    assert cli.main([*argv, "--json", "--check"]) == 0
    decoded = json.loads(capsys.readouterr().out)
    assert decoded["status"] == "OK" and decoded["partitions"][0]["lag"] == 0
    missing = unique_name("missing")
    assert cli.main([*argv, "--topic", missing]) == 1  # a failure (README, "Exit codes")
    assert "does not exist" in capsys.readouterr().err
    assert cli.main([*argv, "--topic", missing, "--check"]) == 1  # --check: could not be measured
    assert "does not exist" in capsys.readouterr().err


# --- partitions without commits, one-shot checks, groups that never started (issue 17) -------


@pytest.fixture
def topic4(new_topic: Callable[..., str]) -> str:
    return new_topic("lag-chunks4", 4)


def produce_to(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    """`counts[p]` one-second chunks to partition p."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for partition, count in counts.items():
        for seq in range(count):
            producer.produce(
                topic, chunk_value(seq), key=b"req-%d" % partition, partition=partition
            )
    assert producer.flush(10) == 0


def joined_consumer(
    bootstrap: str, topic: str, group: str, seen: list[Message] | None = None
) -> Consumer:
    """A subscribed member that holds its assignment and has committed nothing. The poll that
    completes the join may also return a first record: it is appended to `seen`, not lost."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while not consumer.assignment() and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None and seen is not None:
            seen.append(message)
    assert consumer.assignment()
    return consumer


def lag_json(
    bootstrap: str, group: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict]:
    argv = ["lag", "--bootstrap", bootstrap, "--group", group, "--topic", topic]
    code = cli.main([*argv, "--json", "--check"])
    return code, json.loads(capsys.readouterr().out)


def test_stopped_group_with_sessions_on_partitions_it_never_committed_is_not_ok(
    kafka_bootstrap: str,
    topic4: str,
    unique_name: Callable[[str], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The operator's scenario: a consumer ran (committed on partition 0 only), stopped and
    left the group, then new sessions arrived on partitions the group never committed on.
    The very first one-shot sample is not OK, counts their records and audio, and --check
    fails; resuming and draining returns to OK."""
    group = unique_name("lag-group")
    produce_to(kafka_bootstrap, topic4, {0: 12})
    early: list[Message] = []  # read by the poll that completed the join
    consumer = joined_consumer(kafka_bootstrap, topic4, group, early)
    read, deadline = len(early), time.monotonic() + 30
    while read < 12 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        read += message is not None and message.error() is None
    assert read == 12
    consumer.commit(offsets=[TopicPartition(topic4, 0, 12)], asynchronous=False)
    consumer.close()  # like SIGTERM: the member leaves the group
    produce_to(kafka_bootstrap, topic4, {1: 4, 2: 4, 3: 3})

    code, decoded = lag_json(kafka_bootstrap, group, topic4, capsys)
    assert code == 1
    assert decoded["status"] == "ERR" and "empty_with_lag" in decoded["rules"]
    rows = {row["partition"]: row for row in decoded["partitions"]}
    assert (rows[0]["committed_offset"], rows[0]["lag"], rows[0]["from_reset"]) == (12, 0, False)
    for partition, records in {1: 4, 2: 4, 3: 3}.items():
        row = rows[partition]
        assert row["committed_offset"] is None and row["from_reset"] is True
        assert (row["start_offset"], row["lag"]) == (0, records)
        assert row["audio_lag_s"] == pytest.approx(records * 1.0)  # 25 frames = 1 s a chunk
        assert row["time_lag_s"] is not None
    assert decoded["total_lag"] == 11 and decoded["total_audio_lag_s"] == pytest.approx(11.0)
    assert decoded["drained"] is False

    assert (
        cli.main(["lag", "--bootstrap", kafka_bootstrap, "--group", group, "--topic", topic4]) == 0
    )
    table = capsys.readouterr().out
    assert " 4* " in table and "measured from the reset position" in table
    assert "ERR: the group has no members while records wait" in table

    monitor = LagMonitor({"bootstrap.servers": kafka_bootstrap}, group, topic4, config=CONFIG)
    collector = LagCollector("test")
    try:
        sample_all([monitor], collector, int(time.time() * 1000), lambda line: None)
    finally:
        monitor.close()
    series, _ = collector.snapshot()
    values = {
        (s.name, dict(s.labels).get("partition"), dict(s.labels).get("rule")): s.value
        for s in series
    }
    assert values[("kafka_consumergroup_group_lag", "1", None)] == 4.0
    assert values[("codeclog_audio_lag_seconds", "3", None)] == pytest.approx(3.0)
    assert values[("codeclog_partition_lag_from_reset", "1", None)] == 1.0
    assert values[("codeclog_partition_lag_from_reset", "0", None)] == 0.0
    assert values[("codeclog_group_rule", None, "empty_with_lag")] == 1.0
    assert ("kafka_consumergroup_group_offset", "1", None) not in values

    consume_all(kafka_bootstrap, topic4, group, 11).close()  # resumes: reads and commits all
    code, decoded = lag_json(kafka_bootstrap, group, topic4, capsys)
    assert code == 0, decoded
    assert decoded["status"] == "OK" and decoded["rules"] == [] and decoded["drained"] is True
    assert [row["from_reset"] for row in decoded["partitions"]] == [False] * 4


@pytest.mark.parametrize("member_left", [True, False], ids=["crashed_at_start", "still_joined"])
def test_brand_new_group_with_waiting_input_is_not_ok(
    kafka_bootstrap: str,
    topic4: str,
    unique_name: Callable[[str], str],
    capsys: pytest.CaptureFixture[str],
    member_left: bool,
) -> None:
    group = unique_name("lag-group")
    produce_to(kafka_bootstrap, topic4, {0: 20, 1: 20, 2: 20, 3: 16})  # 76 records waiting
    consumer = joined_consumer(kafka_bootstrap, topic4, group)
    try:
        if member_left:
            consumer.close()  # crashed before its first commit: EMPTY, no offsets
        code, decoded = lag_json(kafka_bootstrap, group, topic4, capsys)
    finally:
        if not member_left:
            consumer.close()
    assert code == 1
    assert decoded["status"] == "ERR" and "never_committed" in decoded["rules"]
    assert ("empty_with_lag" in decoded["rules"]) is member_left
    assert decoded["state"] == ("EMPTY" if member_left else "STABLE")
    assert decoded["total_lag"] == 76 and decoded["total_audio_lag_s"] == pytest.approx(76.0)
    assert all(row["from_reset"] for row in decoded["partitions"])
    assert all(row["rule"] != "no_data" for row in decoded["partitions"])


def test_a_group_that_does_not_exist_is_reported_as_such(
    kafka_bootstrap: str,
    topic4: str,
    unique_name: Callable[[str], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    produce_to(kafka_bootstrap, topic4, {2: 3})
    group = unique_name("no-such-group")
    code, decoded = lag_json(kafka_bootstrap, group, topic4, capsys)
    assert code == 1
    assert decoded["exists"] is False and decoded["rules"][0] == "group_not_found"
    assert decoded["member_count"] == 0
    argv = ["lag", "--bootstrap", kafka_bootstrap, "--group", group, "--topic", topic4]
    assert cli.main(argv) == 0  # measured; without --check the status is only reported
    assert "the group does not exist on the cluster" in capsys.readouterr().out


def test_a_chunk_stamped_at_the_epoch_shows_no_57_year_time_lag(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    """The producer's clock decided the time lag: a chunk stamped 1 ms after the epoch showed
    57 years and paged. The chunk topic `topics create` makes is LogAppendTime, so the broker's
    append time is measured; on a topic that keeps CreateTime the stamp is not believed."""
    client = {"bootstrap.servers": kafka_bootstrap}
    names = fresh_topics(unique_name, partitions=1, prefix="epoch-")
    create_topics(client, names)
    created_by_hand = unique_name("epoch-create-time")
    admin = AdminClient(client)
    admin.create_topics([NewTopic(created_by_hand, 1, 1)])[created_by_hand].result(30)
    producer = Producer({**client, "linger.ms": 0})
    for topic in (names.chunks, created_by_hand):
        producer.produce(topic, chunk_value(0), key=b"req-1", partition=0, timestamp=1)
    assert producer.flush(10) == 0
    group = unique_name("epoch-group")  # never committed: measured from the log start
    measurer = LagMeasurer(client)
    try:
        now_ms = int(time.time() * 1000)
        appended = measurer.measure(group, names.chunks, now_ms).partitions[0]
        stamped = measurer.measure(group, created_by_hand, now_ms).partitions[0]
    finally:
        measurer.close()
        admin.delete_topics([names.chunks, names.audio, names.dlq, names.progress, created_by_hand])
    assert appended.lag == 1 and appended.time_lag_s is not None
    assert 0.0 <= appended.time_lag_s < 120.0, appended  # seconds since the append, not years
    assert stamped.lag == 1 and stamped.time_lag_s is None, stamped  # unknown, never paged
    assert stamped.audio_lag_s == pytest.approx(1.0)  # the backlog itself is still measured
