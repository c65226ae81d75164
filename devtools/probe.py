"""Probes of the audio: a read_committed one of the audio topic (every window, and when it became
visible), and a speculative listener (what it played, against the committed copy)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from codeclog.consumers.readers.audio_compare import pcm_digest
from codeclog.kafka.log import client_settings
from codeclog.schemas import wire
from codeclog.schemas.records import AudioChunk
from codeclog.topics_config import TopicsConfig

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


class ListenerProbe(threading.Thread):
    """A speculative `AudioListener` (the live and the audio topic, every epoch) in a thread,
    keeping what it played: per window (request, epoch, index) the sha256 of each copy played
    and whether that copy was the live one. `stop` lets it catch up with both topics first."""

    def __init__(self, client: Mapping[str, Any], topics: TopicsConfig) -> None:
        super().__init__(daemon=True)
        from codeclog.consumers.readers.listener import AudioListener, Isolation, StartMode

        self.listener = AudioListener(
            dict(client),
            topics.audio,
            Isolation.SPECULATIVE,
            start=StartMode.BEGINNING,
            live_topic=topics.live,
        )
        self.played: dict[tuple[str, int, int], list[tuple[str, bool]]] = {}
        self.error: BaseException | None = None
        self._finish = threading.Event()

    def run(self) -> None:
        try:
            while True:
                self._take(self.listener.poll(0.1))
                if self._finish.is_set() and self.listener.caught_up():
                    self._take(self.listener.poll(0.5))  # what was fetched meanwhile
                    if self.listener.caught_up():
                        break
        except BaseException as exc:  # reported by `check`
            self.error = exc
        finally:
            self._take(self.listener.close())

    def _take(self, delivered: list[Any]) -> None:
        for item in delivered:
            if item.pcm:
                key = (item.request_id, item.cache_epoch, item.window_index)
                self.played.setdefault(key, []).append((pcm_digest(item.pcm), not item.committed))

    def stop(self, timeout_s: float = STOP_S * 4) -> None:
        self._finish.set()
        self.join(timeout_s)

    def check(self, committed: Mapping[tuple[str, int, int], str]) -> dict[str, int]:
        """Against the committed audio (window -> sha256): how many windows it played, played
        live, played twice, missed, played beyond the committed copy, with other bytes, and
        left unconfirmed; `ok` 1 when only the first two are non-zero."""
        played = {key: copies[0][0] for key, copies in self.played.items()}
        stats = self.listener.stats
        result = {
            "played": len(played),
            "heard_live": sum(copies[0][1] for copies in self.played.values()),
            "twice": sum(len(copies) > 1 for copies in self.played.values()),
            "missed": len(set(committed) - set(played)),
            "beyond_committed": len(set(played) - set(committed)),
            "other_bytes": sum(committed.get(k, sha) != sha for k, sha in played.items()),
            "unconfirmed": len(played) - stats.confirmed,
            "mismatches": stats.mismatches,
            "alive": int(self.is_alive() or self.error is not None),
        }
        counted = ("twice", "missed", "beyond_committed", "other_bytes", "unconfirmed")
        result["ok"] = int(not any(result[k] for k in (*counted, "mismatches", "alive")))
        return result
