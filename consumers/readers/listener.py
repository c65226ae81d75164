"""A listener client for the audio topic: what a serving process embeds to stream a request's
audio to its user as it is written.

`AudioListener` follows the audio topic (assign(), no group commits) and yields `ListenerChunk`s:
per (request, epoch), in window order (window_index; sample_offset places the PCM), each window
once, with a clear end of stream (`end == "final"` on the epoch's final window).

Isolation:
- committed: read_committed. A window is seen once its step's transaction committed; the
  service writes each window exactly once, so every window arrives exactly once.
- speculative: read_uncommitted. A window is seen as soon as the consumer produced it, before
  the commit; it may belong to a transaction that later aborts. Decoding is deterministic, so
  the window is re-decoded after recovery as the same (request, epoch, window index) with the
  same bytes within a determinism domain. The first copy wins; later copies are compared
  (consumers.readers.audio_compare: bytes within a domain, the numeric bound across domains),
  counted, and never played twice. README.md, "How recovery works", states the guarantee and
  its limits.

Start: by default the listener first scans each partition up to its current end and records,
per request, the newest epoch and the offset where its records begin; it then reads from there,
so a listener started mid-stream catches up from the start of each request's current epoch
(older epochs are skipped). `StartMode.BEGINNING` delivers every epoch on the log.

The pure part, `Assembler` (consumers/readers/assembler.py: ordering, de-duplication and the
memory bounds), takes decoded AudioChunks; `AudioListener` adds Kafka.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from codeclog.consumers.readers.assembler import (
    Assembler,
    ListenerChunk,
    ListenerConfig,
    ListenerStats,
)
from codeclog.kafka.log import client_settings
from codeclog.schemas import wire
from codeclog.schemas.records import AudioChunk

log = logging.getLogger("codeclog.listen")


class Isolation(enum.Enum):
    COMMITTED = "committed"  # read_committed
    SPECULATIVE = "speculative"  # read_uncommitted, first copy wins


class StartMode(enum.Enum):
    CURRENT_EPOCH = "current-epoch"  # each request from the start of its newest epoch
    BEGINNING = "beginning"  # every epoch on the log


ConsumerFactory = Callable[[dict[str, Any]], Any]


class ListenerError(Exception):
    """The listener cannot read the audio topic."""


class AudioListener:
    """An Assembler fed from the audio topic. Iterate it, or call poll() in your own loop.
    Use it from one thread: position() from another thread while one was in poll() was seen
    to block for good (confluent-kafka 2.x), so caught_up() belongs to the polling thread."""

    def __init__(
        self,
        client_config: dict[str, str],
        topic: str,
        isolation: Isolation = Isolation.SPECULATIVE,
        requests: Sequence[str] = (),
        config: ListenerConfig | None = None,
        start: StartMode = StartMode.CURRENT_EPOCH,
        partitions: Sequence[int] | None = None,
        clock: Callable[[], float] = time.time,
        consumer_factory: ConsumerFactory = Consumer,
    ) -> None:
        self.client_config = client_config
        self.topic = topic
        self.isolation = isolation
        self.start_mode = start
        self.assembler = Assembler(config, requests)
        self._partitions = list(partitions) if partitions is not None else None
        self._clock = clock
        self._factory = consumer_factory
        self._consumer: Any = None
        self._wanted = frozenset(r.encode() for r in requests)
        self._closed = False
        self._starts: dict[int, int] = {}  # partition -> the offset it was assigned at

    @property
    def stats(self) -> ListenerStats:
        return self.assembler.stats

    def _config(self) -> dict[str, Any]:
        level = "read_committed" if self.isolation is Isolation.COMMITTED else "read_uncommitted"
        return client_settings(
            self.client_config,
            {
                "group.id": "codeclog-listener",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": level,
                "enable.partition.eof": True,
                # Latency (BENCHMARKS.md, issue 22): the broker answers a fetch as soon as
                # fetch.min.bytes (default 1) are readable (past the high watermark for
                # speculative, the last stable offset for committed), so fetch.wait.max.ms only
                # bounds an idle fetch; 50 ms instead of 500 keeps shutdown and caught_up()
                # prompt. queued.min.messages is prefetch depth, not a delay: default.
                "fetch.wait.max.ms": 50,
            },
        )

    def start(self) -> None:
        """Find where to read from (see the module doc) and assign the partitions."""
        if self._consumer is not None:
            return
        consumer = self._factory(self._config())
        try:
            partitions = self._partitions
            if partitions is None:
                partitions = _partitions_of(consumer, self.topic)
            starts: dict[int, int] = {}
            if self.start_mode is StartMode.CURRENT_EPOCH:
                starts = self._scan(partitions)
            self._starts = {p: starts.get(p, 0) for p in partitions}
            consumer.assign([TopicPartition(self.topic, p, o) for p, o in self._starts.items()])
        except KafkaException as exc:
            consumer.close()
            raise ListenerError(f"cannot read {self.topic}: {exc}") from exc
        self._consumer = consumer

    def _scan(self, partitions: Sequence[int]) -> dict[int, int]:
        """One pass over each partition up to its end now: per request the newest epoch and the
        offset of its first record; returns the offset each partition is read from."""
        scanner = self._factory(self._config())
        newest: dict[str, tuple[int, int, int]] = {}  # rid -> (epoch, first offset, partition)
        ends: dict[int, int] = {}
        try:
            for partition in partitions:
                tp = TopicPartition(self.topic, partition)
                low, high = _watermarks(scanner, tp)
                ends[partition] = high
                if high <= low:
                    continue
                scanner.assign([TopicPartition(self.topic, partition, low)])
                for offset, key, value in _read_to_end(scanner, high):
                    if self._wanted and key not in self._wanted:
                        continue
                    chunk = _audio(value)
                    if chunk is None:
                        continue
                    known = newest.get(chunk.request_id)
                    if known is None or chunk.cache_epoch > known[0]:
                        newest[chunk.request_id] = (chunk.cache_epoch, offset, partition)
        finally:
            scanner.close()
        self.assembler.epoch_floor.update({rid: epoch for rid, (epoch, _, _) in newest.items()})
        starts = dict(ends)
        for _, offset, partition in newest.values():
            starts[partition] = min(starts[partition], offset)
        return starts

    def poll(self, timeout_s: float = 0.1, max_records: int = 500) -> list[ListenerChunk]:
        self.start()
        try:
            # what is already fetched at once; only an empty queue waits for the first record
            # (consume(n, timeout) alone waits the whole timeout unless n records are there)
            messages = self._consumer.consume(max_records, 0)
            if not messages:
                messages = self._consumer.consume(1, timeout_s)
                if messages and max_records > 1:
                    messages.extend(self._consumer.consume(max_records - 1, 0))
        except KafkaException as exc:
            raise ListenerError(f"consume failed: {exc}") from exc
        now = self._clock()
        out: list[ListenerChunk] = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    if error.fatal():
                        raise ListenerError(f"consumer error: {error}")
                    log.warning("consumer error: %s", error)
                continue
            if self._wanted and message.key() not in self._wanted:
                continue
            chunk = _audio(message.value())
            if chunk is not None:
                _, written_ms = message.timestamp()
                out += self.assembler.offer(chunk, now, max(0, written_ms))
        return out

    def caught_up(self) -> bool:
        """Read up to the high watermark of every partition as of now (for a committed
        listener that needs no transaction open: it cannot read past the last stable offset)."""
        self.start()
        assignment = self._consumer.assignment()
        for tp in self._consumer.position(assignment):
            low, high = _watermarks(self._consumer, tp)
            # nothing consumed there yet: the position is unset, reading began at the start
            # offset (the partition's end at start when no current epoch lies in it)
            position = tp.offset if tp.offset >= 0 else self._starts.get(tp.partition, low)
            if max(position, low) < high:
                return False
        return True

    def __iter__(self) -> Iterator[ListenerChunk]:
        while not self._closed:
            yield from self.poll()

    def close(self) -> list[ListenerChunk]:
        """Stop; end every open stream ("closed") and return those last deliveries."""
        self._closed = True
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        return self.assembler.close(self._clock())


_NO_LEADER_YET = frozenset(
    (
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
    )
)


def _watermarks(consumer: Any, tp: TopicPartition, timeout_s: float = 30.0) -> tuple[int, int]:
    """(low, high); retried while a fresh topic's partitions have no leader yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
            return int(low), int(high)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = isinstance(error, KafkaError) and (
                error.retriable() or error.code() in _NO_LEADER_YET
            )
            if not retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _partitions_of(consumer: Any, topic: str) -> list[int]:
    metadata = consumer.list_topics(timeout=30)
    info = metadata.topics.get(topic)
    if info is None or info.error is not None:
        raise ListenerError(f"topic {topic} does not exist")
    return sorted(info.partitions)


def _read_to_end(
    consumer: Any, end: int, timeout_s: float = 60.0
) -> Iterator[tuple[int, Any, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for message in consumer.consume(500, 0.2):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return
                continue
            if message.offset() >= end:
                return
            yield message.offset(), message.key(), message.value()
    raise ListenerError(f"timed out scanning up to offset {end}")


def _audio(value: bytes | None) -> AudioChunk | None:
    try:
        record = wire.decode(value)
    except wire.DecodeError:
        return None
    return record if isinstance(record, AudioChunk) else None
