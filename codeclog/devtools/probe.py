"""A read_committed probe of the audio topic: every window, and when it became visible."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from codeclog.kafka.log import client_settings
from codeclog.schemas import wire
from codeclog.schemas.records import AudioChunk

STOP_S = 30.0  # stop() waits this long for the reading thread


class AudioProbe(threading.Thread):
    """Reads the audio topic's `partitions` from the beginning, read_committed, in a thread:
    `seen` holds (Unix seconds it was read, the window) in the order read. It assigns the
    partitions (no group to join: a join waits for a coordinator, seconds on a fresh cluster)
    and polls often, so a window's time is when a committed reader could first have it."""

    def __init__(self, client: Mapping[str, Any], topic: str, partitions: int) -> None:
        super().__init__(daemon=True)
        settings = {
            "group.id": f"codeclog-probe-{uuid.uuid4().hex[:8]}",  # never joined nor committed
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
        self.consumer = Consumer(client_settings(client, settings))
        self.consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        )
        self.seen: list[tuple[float, AudioChunk]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                for message in self.consumer.consume(500, 0.05):
                    if message.error() is None:
                        self._take(message.value() or b"")
        finally:
            self.consumer.close()

    def _take(self, value: bytes) -> None:
        now = time.time()
        try:
            chunk = wire.decode(value)
        except wire.DecodeError:
            return
        if isinstance(chunk, AudioChunk):
            self.seen.append((now, chunk))

    @property
    def chunks(self) -> list[AudioChunk]:
        return [chunk for _, chunk in self.seen]

    def latencies(self) -> list[tuple[float, float]]:
        """(Unix seconds read, seconds from its newest chunk's produced_at) per window that
        carries a produced_at."""
        return [
            (at, max(0.0, at - chunk.source_produced_at_ms / 1000))
            for at, chunk in self.seen
            if chunk.source_produced_at_ms > 0
        ]

    def stop(self) -> None:
        self._halt.set()
        self.join(STOP_S)
