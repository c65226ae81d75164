"""ChunkPublisher against a scripted stand-in for confluent_kafka.Producer (no broker)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from codeclog.producers.publisher import (
    ChunkPublisher,
    DeliveryFailure,
    PublishBackpressureError,
    PublisherClosedError,
    PublisherConfig,
    PublisherConfigError,
    producer_settings,
)
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind

Callback = Callable[[KafkaError | None, Any], None]


class FakeProducer:
    """Queues produce() calls; poll() reports each with `outcome` (None = delivered)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.queue: list[tuple[str, bytes, bytes, Callback]] = []
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.buffer_errors = 0  # the next N produce() calls find the queue full
        self.sync_error: KafkaException | None = None
        self.outcome: KafkaError | None = None
        self.deliver_on_poll = True
        self.purged = False

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Callback) -> None:
        if self.buffer_errors:
            self.buffer_errors -= 1
            raise BufferError("Local: Queue full")
        if self.sync_error is not None:
            raise self.sync_error
        self.queue.append((topic, value, key, on_delivery))

    def poll(self, _timeout: float) -> int:
        if not self.deliver_on_poll:
            return 0
        return self._serve(self.outcome)

    def _serve(self, outcome: KafkaError | None) -> int:
        served, self.queue = self.queue, []
        for topic, value, key, callback in served:
            if outcome is None:
                self.sent.append((topic, value, key))
            callback(outcome, None)
        return len(served)

    def flush(self, timeout: float) -> int:
        self.poll(timeout)
        return len(self.queue)

    def purge(self, in_queue: bool, in_flight: bool, blocking: bool) -> None:
        self.purged = True
        self._serve(KafkaError(KafkaError._PURGE_QUEUE))

    def __len__(self) -> int:
        return len(self.queue)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(
    config: PublisherConfig | None = None,
    on_failure: Callable[[DeliveryFailure], None] | None = None,
    clock: Callable[[], float] | None = None,
) -> tuple[ChunkPublisher, FakeProducer]:
    holder: list[FakeProducer] = []

    def factory(settings: dict[str, Any]) -> FakeProducer:
        holder.append(FakeProducer(settings))
        return holder[0]

    publisher = ChunkPublisher(
        {"bootstrap.servers": "x:1"},
        config or PublisherConfig(topic="t"),
        on_failure=on_failure,
        clock=clock or FakeClock(),
        producer_factory=factory,
    )
    return publisher, holder[0]


CHUNK = CodecChunk("r1", (4218, 4218, 4218, 1, 2), chunk_seq=0, code_flat_numel=5)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("enable.idempotence", "false"),
        ("acks", "1"),
        ("partitioner", "consistent_random"),
        ("compression.type", "lz4"),
    ],
)
def test_user_config_cannot_weaken_the_guarantees(key: str, value: str) -> None:
    with pytest.raises(PublisherConfigError, match=key):
        producer_settings({"bootstrap.servers": "x:1", key: value}, PublisherConfig())


def test_settings_carry_idempotence_murmur2_and_linger() -> None:
    settings = producer_settings(
        {"bootstrap.servers": "x:1", "acks": "all", "security.protocol": "SSL"},
        PublisherConfig(linger_ms=5, producer_id="talker-7"),
    )
    assert settings["enable.idempotence"] is True
    assert (settings["acks"], settings["partitioner"]) == ("all", "murmur2_random")
    assert (settings["compression.type"], settings["linger.ms"]) == ("none", 5)
    assert (settings["security.protocol"], settings["client.id"]) == ("SSL", "talker-7")


@pytest.mark.parametrize(
    "fields",
    [{"topic": ""}, {"linger_ms": -1}, {"delivery_timeout_ms": 0}, {"queue_max_records": 0}],
)
def test_invalid_publisher_config(fields: dict[str, Any]) -> None:
    with pytest.raises(PublisherConfigError):
        PublisherConfig(**fields)


def test_records_are_keyed_by_request_and_wire_encoded() -> None:
    publisher, producer = make()
    publisher.publish(CHUNK)
    publisher.publish(ControlEvent("r1", ControlKind.ABORT))
    assert [(topic, key) for topic, _, key in producer.sent] == [("t", b"r1"), ("t", b"r1")]
    assert producer.sent[0][1] == wire.encode(CHUNK)
    stats = publisher.stats
    assert (stats.published, stats.delivered, stats.failed, stats.in_flight) == (2, 2, 0, 0)
    assert len(stats.latency_ms) == 2


def test_delivery_failure_is_reported_not_dropped() -> None:
    seen: list[DeliveryFailure] = []
    publisher, producer = make(on_failure=seen.append)
    producer.outcome = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    publisher.publish(CHUNK)
    assert seen == publisher.failures
    assert [(f.request_id, f.kind, f.cache_epoch, f.chunk_seq) for f in seen] == [
        ("r1", "codec_chunk", 0, 0)
    ]
    assert seen[0].error_name == "MSG_SIZE_TOO_LARGE"
    assert (publisher.stats.failed, publisher.stats.delivered) == (1, 0)


def test_synchronous_produce_error_is_reported() -> None:
    seen: list[DeliveryFailure] = []
    publisher, producer = make(on_failure=seen.append)
    producer.sync_error = KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    publisher.publish(ControlEvent("r9", ControlKind.FINISH))
    assert [(f.request_id, f.kind, f.error_name) for f in seen] == [
        ("r9", "control_event:finish", "MSG_SIZE_TOO_LARGE")
    ]
    assert (publisher.stats.published, publisher.stats.failed) == (0, 1)


def test_full_queue_waits_then_publishes() -> None:
    publisher, producer = make()
    producer.buffer_errors = 3
    publisher.publish(CHUNK)
    assert publisher.stats.published == 1
    assert publisher.stats.backpressure_waits == 1


def test_full_queue_past_the_deadline_raises_backpressure() -> None:
    clock = FakeClock()
    publisher, producer = make(PublisherConfig(topic="t", backpressure_timeout_s=0.2), clock=clock)
    producer.buffer_errors = 10**9

    def poll(timeout: float) -> int:
        clock.now += timeout  # polling is where the time goes
        return 0

    producer.poll = poll  # type: ignore[method-assign,assignment]
    with pytest.raises(PublishBackpressureError, match="r1"):
        publisher.publish(CHUNK)
    assert publisher.stats.published == 0
    assert clock.now == pytest.approx(100.2)


def test_close_purges_and_reports_what_was_not_delivered() -> None:
    publisher, producer = make()
    producer.deliver_on_poll = False
    publisher.publish(CHUNK)
    publisher.publish(CHUNK)
    report = publisher.close(timeout_s=0.01)
    assert producer.purged
    assert (report.undelivered, report.failed, report.delivered) == (2, 2, 0)
    assert [f.error_name for f in publisher.failures] == ["_PURGE_QUEUE", "_PURGE_QUEUE"]
    with pytest.raises(PublisherClosedError):
        publisher.publish(CHUNK)


def test_close_after_clean_delivery_reports_nothing_missing() -> None:
    publisher, _producer = make()
    publisher.publish(CHUNK)
    report = publisher.close()
    assert (report.delivered, report.failed, report.undelivered) == (1, 0, 0)
    assert publisher.close() == report
