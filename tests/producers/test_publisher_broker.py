"""ChunkPublisher and Talker on the real local Kafka broker."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from codeclog.devtools.broker import BrokerSettings, LocalBroker
from codeclog.producers.publisher import (
    ChunkPublisher,
    DeliveryFailure,
    PublisherConfig,
    TopicNotReadyError,
    topic_partition_count,
)
from codeclog.producers.synthetic import SyntheticConfig, merged, scripts
from codeclog.producers.talker import Record, Talker
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk

pytestmark = pytest.mark.kafka

Key = tuple[int, str, int, int]  # (partition, request id, epoch, seq) for readable diffs


def create_topic(bootstrap: str, topic: str, partitions: int, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=config)])
    futures[topic].result(30)
    deadline = time.monotonic() + 30
    while topic not in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"topic {topic} never became visible"
        time.sleep(0.1)


def consume_all(
    bootstrap: str, topic: str, group: str, expected: int
) -> list[tuple[int, bytes, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    out: list[tuple[int, bytes, bytes]] = []
    deadline = time.monotonic() + 60
    idle_after_expected = 0
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                if len(out) >= expected:
                    idle_after_expected += 1
                    if idle_after_expected >= 4:  # wait a little for unexpected extras
                        break
                continue
            assert message.error() is None, message.error()
            partition, key, value = message.partition(), message.key(), message.value()
            assert partition is not None and key is not None and value is not None
            out.append((partition, key, value))
    finally:
        consumer.close()
    return out


class RecordingSink:
    """Publishes through the real publisher and remembers the order, per request id."""

    def __init__(self, publisher: ChunkPublisher) -> None:
        self.publisher = publisher
        self.sent: dict[str, list[Record]] = defaultdict(list)

    def publish(self, record: Record) -> None:
        self.publisher.publish(record)
        self.sent[record.request_id].append(record)


def murmur2(data: bytes) -> int:
    """Kafka's Utils.murmur2 (the Java client's default partitioner hash)."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[length - length % 4 :]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def java_partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def test_murmur2_matches_kafka_reference_values() -> None:
    # Values from Kafka's UtilsTest.testMurmur2 / DefaultPartitionerTest.
    assert murmur2(b"21") == (-973932308) & 0xFFFFFFFF
    assert murmur2(b"foobar") == (-790332482) & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-long-string") == (-985981536) & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-longer-string") == (-1486304829) & 0xFFFFFFFF


def check_log(
    sink: RecordingSink, consumed: list[tuple[int, bytes, bytes]], partitions: int
) -> None:
    """Each request's records, read back: all there, once, in order, on the Java partition."""
    got: dict[str, list[object]] = defaultdict(list)
    for partition, key, value in consumed:
        request_id = key.decode()
        assert partition == java_partition(key, partitions), request_id
        got[request_id].append(wire.decode(value))
    assert set(got) == set(sink.sent)
    for request_id, records in sink.sent.items():
        assert got[request_id] == records, request_id


def test_streams_read_back_in_order_per_key(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("chunks")
    create_topic(kafka_bootstrap, topic, 4)
    assert topic_partition_count({"bootstrap.servers": kafka_bootstrap}, topic) == 4
    publisher = ChunkPublisher({"bootstrap.servers": kafka_bootstrap}, PublisherConfig(topic))
    sink = RecordingSink(publisher)
    talker = Talker(sink, producer_id="test", native_duplex=True)
    for item in merged(scripts(SyntheticConfig(sessions=12, seconds=12, seed=21))):
        talker.apply(item.step)
    report = publisher.close(30)
    assert (report.failed, report.undelivered) == (0, 0)
    total = sum(len(records) for records in sink.sent.values())
    assert report.delivered == total == publisher.stats.published
    assert len(publisher.stats.latency_ms) == total
    consumed = consume_all(kafka_bootstrap, topic, unique_name("g"), total)
    assert len(consumed) == total
    check_log(sink, consumed, 4)


def test_missing_topic_is_refused_before_publishing(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("never-created")
    with pytest.raises(TopicNotReadyError, match="topics create"):
        topic_partition_count({"bootstrap.servers": kafka_bootstrap}, topic)
    # Asking must not have auto-created it.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    assert topic not in admin.list_topics(timeout=10).topics


def test_unreachable_cluster_is_refused() -> None:
    with pytest.raises(TopicNotReadyError, match="no answer"):
        topic_partition_count({"bootstrap.servers": "127.0.0.1:9"}, "t", timeout_s=1.0)


def test_record_the_broker_refuses_is_reported_not_dropped(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("small")
    create_topic(kafka_bootstrap, topic, 1, **{"max.message.bytes": "2000"})
    seen: list[DeliveryFailure] = []
    publisher = ChunkPublisher(
        {"bootstrap.servers": kafka_bootstrap}, PublisherConfig(topic), on_failure=seen.append
    )
    small = CodecChunk("ok", (1, 2, 3, 4), code_flat_numel=4)
    large = CodecChunk("big", (1, 2, 3, 4), chunk_seq=0, llm_output_text_utf8=b"x" * 5000)
    publisher.publish(small)
    # Flushed apart: the broker checks max.message.bytes per record batch, and a batch holding
    # both records would be refused whole (both reported).
    assert publisher.flush(30) == 0
    publisher.publish(large)
    report = publisher.close(30)
    assert (report.delivered, report.failed, report.undelivered) == (1, 1, 0)
    assert [(f.request_id, f.kind, f.chunk_seq, f.error_name) for f in seen] == [
        ("big", "codec_chunk", 0, "MSG_SIZE_TOO_LARGE")
    ]
    assert publisher.failures == seen


def test_record_too_large_for_the_client_is_reported_not_dropped(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("client-limit")
    create_topic(kafka_bootstrap, topic, 1)
    seen: list[DeliveryFailure] = []
    publisher = ChunkPublisher(
        {"bootstrap.servers": kafka_bootstrap, "message.max.bytes": "1500"},
        PublisherConfig(topic),
        on_failure=seen.append,
    )
    publisher.publish(CodecChunk("big", (1,), llm_output_text_utf8=b"y" * 4000))
    report = publisher.close(10)
    assert report.failed == 1
    assert [(f.request_id, f.error_name) for f in seen] == [("big", "MSG_SIZE_TOO_LARGE")]


@pytest.mark.slow
def test_broker_restart_mid_stream_loses_duplicates_and_reorders_nothing(
    tmp_path: Path, unique_name: Callable[[str], str]
) -> None:
    broker = LocalBroker(tmp_path / "restart-broker", BrokerSettings(die_with_parent=True))
    bootstrap = broker.start().bootstrap
    try:
        _publish_across_a_restart(broker, bootstrap, unique_name)
    finally:
        broker.stop()


def _publish_across_a_restart(
    broker: LocalBroker, bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("restart")
    create_topic(bootstrap, topic, 3)
    config = PublisherConfig(topic, delivery_timeout_ms=180_000, backpressure_timeout_s=60)
    publisher = ChunkPublisher({"bootstrap.servers": bootstrap}, config)
    sink = RecordingSink(publisher)
    talker = Talker(sink, producer_id="restart", native_duplex=True)
    steps = list(merged(scripts(SyntheticConfig(sessions=6, seconds=15, seed=8))))
    first, second, third = len(steps) // 3, 2 * len(steps) // 3, len(steps)
    for item in steps[:first]:
        talker.apply(item.step)  # many of these are still in flight when the broker stops
    broker.stop()
    for item in steps[first:second]:
        talker.apply(item.step)  # queued locally while the broker is down
    assert publisher.stats.in_flight > 0  # the restart really had records waiting on it
    assert broker.start().bootstrap == bootstrap  # same data dir, same ports
    for item in steps[second:third]:
        talker.apply(item.step)
    report = publisher.close(120)
    total = sum(len(records) for records in sink.sent.values())
    assert (report.failed, report.undelivered, report.delivered) == (0, 0, total)
    consumed = consume_all(bootstrap, topic, unique_name("g"), total)
    assert len(consumed) == total
    check_log(sink, consumed, 3)
