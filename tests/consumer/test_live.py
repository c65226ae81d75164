"""The live writer without a broker: it never waits (a full queue drops and counts the copy), it
writes nothing when the live topic is missing, and a failed delivery is counted and told once."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError

from codeclog.consumers.member.live import LiveWriter, live_producer_config
from codeclog.consumers.member.metrics import VocoderMetrics
from codeclog.consumers.member.step_writes import OutputRecord


class FullQueue:
    """A producer whose local queue holds `room` records; polls are recorded."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.queued: list[bytes] = []
        self.polls: list[float] = []

    def produce(self, topic: str, value: bytes, key: str, on_delivery: Any) -> None:
        if len(self.queued) >= self.room:
            raise BufferError("Local: Queue full")
        self.queued.append(value)

    def poll(self, timeout: float) -> int:
        self.polls.append(timeout)
        return 0


def _writer() -> LiveWriter:
    return LiveWriter({"bootstrap.servers": "127.0.0.1:1"}, VocoderMetrics.create(None))


def test_a_full_queue_drops_the_live_copy_and_never_waits() -> None:
    writer = _writer()
    writer.producer = FullQueue(room=2)  # type: ignore[assignment]
    writer.write([OutputRecord("a.live", "r", bytes([n])) for n in range(3)])
    assert writer.producer.queued == [b"\x00", b"\x01"]  # type: ignore[union-attr]
    assert writer.producer.polls == [0]  # type: ignore[union-attr]
    assert writer.counts == {"written": 0, "failed": 0, "dropped": 1}


def test_without_the_live_topic_nothing_is_written(caplog: pytest.LogCaptureFixture) -> None:
    writer = _writer()
    with caplog.at_level(logging.WARNING, logger="codeclog.vocode"):
        writer.start("a.live", exists=False)
    writer.write([OutputRecord("a.live", "r", b"x")])
    assert writer.producer is None
    assert "topic a.live does not exist: no live copies" in caplog.text


def test_failed_deliveries_are_counted_and_told_once_per_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer = _writer()
    timed_out = KafkaError(KafkaError._MSG_TIMED_OUT)
    with caplog.at_level(logging.INFO, logger="codeclog.vocode"):
        writer._delivered(timed_out, None)
        writer._delivered(timed_out, None)
        writer._delivered(None, None)
    assert writer.counts == {"written": 1, "failed": 2, "dropped": 0}
    assert caplog.text.count("a live copy was not delivered") == 1
    assert "live copies are delivered again" in caplog.text


def test_the_live_producer_is_idempotent_without_transactions_and_gives_up_soon() -> None:
    config = live_producer_config({"bootstrap.servers": "b:1"})
    assert config["enable.idempotence"] is True and "transactional.id" not in config
    assert config["message.timeout.ms"] == 5_000
    assert config["allow.auto.create.topics"] is False
