"""Republish a capture into a live topic: same keys, values and headers, order per key kept.
Why the order holds: docs/replay.md, "Republish"."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from codeclog.kafka.access import (
    authorization_error,
    is_authorization_error,
    raise_if_topic_refused,
)
from codeclog.kafka.log import client_settings
from codeclog.replay.capture_format import CapturedRecord, TimestampType
from codeclog.replay.errors import RepublishError
from codeclog.replay.inputs import ReplayInput, log_order

PARTITIONER = "murmur2_random"


@dataclasses.dataclass(frozen=True)
class RepublishSummary:
    produced: int
    delivered: int
    failed: int
    keys: int
    first_error: str = ""


def producer_config(client_config: Mapping[str, str]) -> dict[str, Any]:
    return client_settings(
        {"log_level": "2"},  # failures surface as one error sentence instead
        client_config,
        {
            "enable.idempotence": True,
            "partitioner": PARTITIONER,
            "linger.ms": 5,
            "acks": "all",
            "allow.auto.create.topics": False,  # a typo must not create a topic
        },
    )


@dataclasses.dataclass
class _Deliveries:
    """Counts filled in by the delivery callbacks (librdkafka calls them from poll/flush)."""

    delivered: int = 0
    failed: int = 0
    first_error: str = ""
    refused: Any = None  # the first delivery error that is an authorisation refusal

    def on_delivery(self, error: Any, message: Any) -> None:
        if error is None:
            self.delivered += 1
            return
        self.failed += 1
        self.first_error = self.first_error or error.str()
        if self.refused is None and is_authorization_error(error):
            self.refused = error


class _Refused(Exception):
    """A delivery refused by the authorizer: run_republish names the principal."""

    def __init__(self, error: Any) -> None:
        super().__init__(error)
        self.error = error


def republish(
    producer: Any,
    topic: str,
    records: Sequence[CapturedRecord],
    keep_timestamps: bool = False,
    flush_timeout_s: float = 60.0,
    on_progress: Callable[[int, int], None] | None = None,
) -> RepublishSummary:
    ordered = log_order(records)
    deliveries = _Deliveries()
    for index, record in enumerate(ordered):
        _produce(producer, topic, record, keep_timestamps, deliveries)
        if on_progress is not None and index % 1000 == 0:
            on_progress(index, len(ordered))
    remaining = producer.flush(flush_timeout_s)
    if remaining:
        raise RepublishError(
            f"{remaining} record(s) were still undelivered after {flush_timeout_s:.0f} s"
        )
    if deliveries.refused is not None:
        raise _Refused(deliveries.refused)
    keys = len({r.key for r in ordered})
    return RepublishSummary(
        len(ordered), deliveries.delivered, deliveries.failed, keys, deliveries.first_error
    )


def _produce(
    producer: Any,
    topic: str,
    record: CapturedRecord,
    keep_timestamps: bool,
    deliveries: _Deliveries,
) -> None:
    extra: dict[str, Any] = {}
    if keep_timestamps and record.timestamp_type is TimestampType.CREATE_TIME:
        extra["timestamp"] = record.timestamp_ms
    headers = [(h.key, h.value) for h in record.headers]
    while True:
        try:
            producer.produce(
                topic,
                value=record.value,
                key=record.key,
                headers=headers or None,
                on_delivery=deliveries.on_delivery,
                **extra,
            )
            return
        except BufferError:
            producer.poll(0.1)  # the local queue is full: let deliveries drain it


def check_topic(producer: Any, topic: str, timeout_s: float = 15.0) -> int:
    """The target's partition count; a missing topic is an error (no auto-create surprises)."""
    metadata = producer.list_topics(timeout=timeout_s)  # whole cluster: never auto-creates
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise RepublishError(
            f"topic {topic!r} does not exist; create it first (codeclog topics create, or your "
            "cluster's tooling) with the partition count you want"
        )
    return len(found.partitions)


def run_republish(
    client_config: Mapping[str, str],
    topic: str,
    records: Sequence[CapturedRecord],
    keep_timestamps: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
) -> RepublishSummary:
    from confluent_kafka import KafkaException, Producer

    try:
        producer = Producer(producer_config(client_config))
        try:
            check_topic(producer, topic)
        except RepublishError:
            raise_if_topic_refused(client_config, topic)
            raise
        return republish(producer, topic, records, keep_timestamps, on_progress=on_progress)
    except _Refused as exc:
        raise authorization_error(client_config, "WRITE", f"topic {topic}", exc.error) from None
    except KafkaException as exc:
        raise RepublishError(f"republishing to {topic!r} failed: {exc.args[0].str()}") from exc


def scenario_records(source: ReplayInput) -> tuple[CapturedRecord, ...]:
    """A scenario's events as records (wire-encoded, keyed by request id) for republishing."""
    from codeclog.schemas.wire import encode

    return tuple(
        CapturedRecord(
            topic=source.name,
            partition=0,
            offset=index,
            timestamp_ms=event.produced_at_ms,
            timestamp_type=TimestampType.CREATE_TIME,
            key=event.request_id.encode(),
            value=encode(event),
        )
        for index, event in enumerate(source.events)
    )
