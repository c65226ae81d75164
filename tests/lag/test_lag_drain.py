"""'Drained': every partition with data committed to its end (lag.drain), pure and on the broker."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

import codeclog.cli as cli
from codeclog.lag.drain import undrained, wait_drained
from codeclog.lag.evaluator import GroupStatus, PartitionStatus, Rule
from codeclog.lag.report import GroupReport, PartitionReport


def row(number: int, committed: int | None, lag: int | None) -> PartitionReport:
    return PartitionReport(
        topic="t",
        partition=number,
        committed_offset=committed,
        earliest_offset=0,
        end_offset=None if lag is None else (committed or 0) + lag,
        lag=lag,
        time_lag_s=None,
        audio_lag_s=None,
        owned=None,
        status=PartitionStatus.OK,
        rule=Rule.NOT_GROWING,
        idle_ms=None,
        samples=1,
        start_offset=0 if committed is None else committed,
        from_reset=committed is None,
    )


def report(*rows: PartitionReport) -> GroupReport:
    return GroupReport("g", "t", 0, GroupStatus.OK, "STABLE", 1, rows, 1.0, 0.0)


def test_undrained_names_each_partition_and_why() -> None:
    result = report(row(0, 12, 0), row(1, None, 4), row(2, 7, 3), row(3, None, None))
    assert not result.drained
    assert undrained(result) == [
        "partition 1: never committed, 4 records from the reset position",
        "partition 2: committed 7, 3 records behind",
        "partition 3: lag unknown",
    ]


def test_partitions_without_data_need_no_commit() -> None:
    result = report(row(0, 12, 0), row(1, None, 0))
    assert result.drained and undrained(result) == []


# --- on the real broker ---------------------------------------------------------------------


@pytest.fixture
def topic(new_topic: Callable[..., str]) -> str:
    return new_topic("drain-chunks", 3)


def commit(bootstrap: str, group: str, offsets: list[TopicPartition]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
    finally:
        consumer.close()


@pytest.mark.kafka
def test_wait_drained_waits_for_every_partition_with_data(
    kafka_bootstrap: str, topic: str, unique_name: Callable[[str], str]
) -> None:
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for partition, count in ((0, 5), (1, 2)):  # partition 2 stays empty
        for _ in range(count):
            producer.produce(topic, b"x", partition=partition)
    assert producer.flush(10) == 0
    group = unique_name("drain-group")
    client = {"bootstrap.servers": kafka_bootstrap}
    commit(kafka_bootstrap, group, [TopicPartition(topic, 0, 5)])  # total lag of committed: 0

    result = wait_drained(client, group, topic, timeout_s=0)
    assert not result.drained
    assert undrained(result) == ["partition 1: never committed, 2 records from the reset position"]

    commit(kafka_bootstrap, group, [TopicPartition(topic, 1, 2)])
    sleeps: list[float] = []
    result = wait_drained(client, group, topic, timeout_s=30, sleep=sleeps.append)
    assert result.drained, undrained(result)
    assert sleeps == []  # drained at the first measurement: no waiting


@pytest.mark.kafka
def test_verify_refuses_a_group_that_is_not_drained(
    kafka_bootstrap: str,
    topic: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, b"x", partition=2)
    assert producer.flush(10) == 0
    group = unique_name("drain-group")
    topics = tmp_path / "topics.json"
    topics.write_text(json.dumps({"chunks": topic}))
    argv = ["verify", "--bootstrap", kafka_bootstrap, "--group", group, "--drain-timeout", "0"]
    code = cli.main([*argv, "--topics-config", str(topics)])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith(f"codeclog verify: group {group} is not drained after 0 s:")
    assert "partition 2: never committed, 1 records from the reset position" in err
    assert "\n" not in err and "Traceback" not in err
