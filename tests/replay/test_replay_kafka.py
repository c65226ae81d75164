"""Capture and republish on the real broker: transactions, bounds, filters, round trips."""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from codeclog.consumers.stream.fold.report import build_report
from codeclog.consumers.stream.fold.state import FoldConfig
from codeclog.replay.capture_format import CapturedRecord, read_capture
from codeclog.replay.diff import diff_captures
from codeclog.schemas.wire import encode
from codeclog.testing.upstream_streams import realistic_events

RunCli = Callable[[Sequence[str]], tuple[int, str, str]]  # the run_cli fixture

pytestmark = pytest.mark.kafka


def _create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    futures[name].result(30)


def _txn_producer(bootstrap: str, txn_id: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 1}
    )
    producer.init_transactions(30)
    return producer


def _transaction(producer: Producer, topic: str, values: list[bytes], commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, key=b"r1", value=value, partition=0, headers=[("h", value)])
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def _capture(run_cli: RunCli, bootstrap: str, *argv: str) -> tuple[int, str, str]:
    return run_cli(["capture", "--bootstrap", bootstrap, *argv])


def test_capture_skips_aborted_records_keeps_offsets_and_stops_at_the_lso(
    kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path, run_cli: RunCli
) -> None:
    topic = unique_name("capture-txn")
    _create_topic(kafka_bootstrap, topic, partitions=2)
    producer = _txn_producer(kafka_bootstrap, unique_name("txn"))
    _transaction(producer, topic, [b"c0", b"c1", b"c2"], commit=True)  # offsets 0-2, marker 3
    _transaction(producer, topic, [b"a0", b"a1"], commit=False)  # offsets 4-5, marker 6
    _transaction(producer, topic, [b"c7", b"c8"], commit=True)  # offsets 7-8, marker 9
    plain = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for value in (b"p0", b"p1"):
        plain.produce(topic, key=b"r2", value=value, partition=1)
    plain.flush(30)
    producer.begin_transaction()  # left open: its records lie past the LSO
    producer.produce(topic, key=b"r1", value=b"open", partition=0)
    producer.flush(30)

    out = tmp_path / "txn.ocf"
    code, stdout, err = _capture(run_cli, kafka_bootstrap, "--topic", topic, "--out", str(out))
    producer.abort_transaction(30)

    assert code == 0, err
    assert "captured 7 of 7 records" in stdout
    metadata, records, truncated = read_capture(out)
    assert not truncated
    assert [(r.partition, r.offset, r.value) for r in records if r.partition == 0] == [
        (0, 0, b"c0"),
        (0, 1, b"c1"),
        (0, 2, b"c2"),
        (0, 7, b"c7"),
        (0, 8, b"c8"),
    ]
    assert [(r.offset, r.value) for r in records if r.partition == 1] == [(0, b"p0"), (1, b"p1")]
    assert [(h.key, h.value) for h in records[0].headers] == [("h", b"c0")]
    assert {(s.partition, s.start, s.end) for s in metadata.spans} == {(0, 0, 10), (1, 0, 2)}
    assert metadata.isolation_level == "read_committed"
    assert metadata.partition_count == 2 and metadata.topic == topic
    assert metadata.cluster_id not in ("", "unknown")
    assert all(r.schema_fingerprint is None for r in records)  # raw bytes, not SOE


def test_capture_bounds_partitions_and_request_filter(
    kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path, run_cli: RunCli
) -> None:
    topic = unique_name("capture-bounds")
    _create_topic(kafka_bootstrap, topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    base_ms = 1_767_225_600_000
    for offset in range(10):
        for partition, key in ((0, b"a" if offset % 2 else b"b"), (1, b"c")):
            producer.produce(
                topic,
                key=key,
                value=b"%d" % offset,
                partition=partition,
                timestamp=base_ms + 1000 * offset,
            )
    producer.flush(30)

    out = tmp_path / "bounded.ocf"
    argv = [
        "--topic",
        topic,
        "--out",
        str(out),
        "--partition",
        "0",
        "--from",
        "3",
        "--until",
        f"{base_ms + 7000}ms",
        "--request",
        "a",
        "--group-less",
    ]
    code, _stdout, err = _capture(run_cli, kafka_bootstrap, *argv)
    assert code == 0, err
    metadata, records, _ = read_capture(out)
    assert [(r.partition, r.offset, r.key) for r in records] == [(0, 3, b"a"), (0, 5, b"a")]
    assert [(s.partition, s.start, s.end) for s in metadata.spans] == [(0, 3, 7)]
    assert metadata.request_filter == ("a",)
    assert records[0].timestamp_ms == base_ms + 3000

    code, _, err = _capture(
        run_cli, kafka_bootstrap, "--topic", topic, "--out", str(out), "--partition", "5"
    )
    assert code == 1 and "no partition 5" in err
    absent = unique_name("absent")
    code, _, err = _capture(run_cli, kafka_bootstrap, "--topic", absent, "--out", str(out))
    assert code == 1 and "does not exist" in err
    code, _, err = run_cli(
        ["replay", str(out), "--to-topic", absent, "--bootstrap", kafka_bootstrap]
    )
    assert code == 1 and "does not exist" in err
    _assert_never_auto_created(kafka_bootstrap, absent, unique_name("control"))


def _assert_never_auto_created(bootstrap: str, topic: str, control: str) -> None:
    """Positive evidence that nothing auto-created `topic` (the broker allows auto-creation).

    First a control topic is auto-created on purpose (a metadata request that allows it) and
    awaited: auto-creation works here and every request sent before it, the CLI's included, has
    been handled. Then the test creates `topic` itself with a partition count no auto-creation
    uses: that succeeds, with that count, only if no one created the topic before.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    asker = Producer({"bootstrap.servers": bootstrap, "allow.auto.create.topics": True})
    deadline = time.monotonic() + 30
    while control not in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"the control topic {control} was never auto-created"
        asker.list_topics(topic=control, timeout=5)  # asking for it creates it
        time.sleep(0.1)
    partitions = 7  # not the broker's num.partitions
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions)])
    futures[topic].result(timeout=30)  # raises TOPIC_ALREADY_EXISTS had anything created it
    metadata = admin.list_topics(topic=topic, timeout=10).topics[topic]
    assert len(metadata.partitions) == partitions


def _per_key(records: list[CapturedRecord]) -> dict[bytes | None, list[bytes | None]]:
    grouped: dict[bytes | None, list[bytes | None]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        grouped[record.key].append(record.value)
    return dict(grouped)


def test_republish_round_trip_and_replay_of_a_live_capture(
    kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path, run_cli: RunCli
) -> None:
    source, target = unique_name("talk"), unique_name("rerun")
    _create_topic(kafka_bootstrap, source, partitions=4)
    _create_topic(kafka_bootstrap, target, partitions=3)
    events = realistic_events(random.Random(11), sessions=12, turns=2)
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
        }
    )
    for event in events:
        producer.produce(source, key=event.request_id.encode(), value=encode(event))
    producer.flush(30)

    first, second = tmp_path / "first.ocf", tmp_path / "second.ocf"
    assert _capture(run_cli, kafka_bootstrap, "--topic", source, "--out", str(first))[0] == 0
    code, stdout, err = run_cli(
        ["replay", str(first), "--to-topic", target, "--bootstrap", kafka_bootstrap]
    )
    assert code == 0, err
    assert f"republished {len(events)} records (12 keys)" in stdout
    assert f"{len(events)} delivered, 0 failed" in stdout
    assert _capture(run_cli, kafka_bootstrap, "--topic", target, "--out", str(second))[0] == 0

    records_a, records_b = read_capture(first)[1], read_capture(second)[1]
    assert _per_key(records_a) == _per_key(records_b)
    assert diff_captures(records_a, records_b) == []
    assert run_cli(["diff", str(first), str(second)])[0] == 0

    code, stdout, _ = run_cli(["replay", str(first), "--json"])
    report = json.loads(stdout)
    expected = build_report(events, FoldConfig())
    assert {key: report[key] for key in expected} == expected
    assert report["dead_letters"]["total"] == 0
