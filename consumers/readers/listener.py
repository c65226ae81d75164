"""A listener client for the audio (`AudioListener`, the Kafka side of the pure `Assembler`): what a
serving process embeds to stream a request's audio to its user as it is written.
Isolation and start: docs/listening.md, "Two copies of every window"."""

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
from codeclog.topics_config import live_topic_of

log = logging.getLogger("codeclog.listen")


class Isolation(enum.Enum):
    COMMITTED = "committed"  # the audio topic, read_committed
    SPECULATIVE = "speculative"  # the live topic and the audio topic, first copy wins


class StartMode(enum.Enum):
    CURRENT_EPOCH = "current-epoch"  # each request from the start of its newest epoch
    BEGINNING = "beginning"  # every epoch on the log
    END = "end"  # what is written from now on (a reader of requests not started yet)


ConsumerFactory = Callable[[dict[str, Any]], Any]
TP = tuple[str, int]  # topic, partition


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
        live_topic: str | None = None,
    ) -> None:
        """`topic`: the audio topic; `live_topic` (speculative only): the live topic, by default
        the audio topic's name + ".live" (as codeclog.topics_config)."""
        self.client_config = client_config
        self.topic = topic
        self.live_topic = live_topic or live_topic_of(topic)
        self.isolation = isolation
        self.start_mode = start
        self.assembler = Assembler(config, requests)
        self._partitions = list(partitions) if partitions is not None else None
        self._clock = clock
        self._factory = consumer_factory
        self._consumer: Any = None
        self._wanted = frozenset(r.encode() for r in requests)
        self._closed = False
        self._starts: dict[TP, int] = {}  # (topic, partition) -> the offset it was assigned at

    @property
    def stats(self) -> ListenerStats:
        return self.assembler.stats

    def _config(self) -> dict[str, Any]:
        return client_settings(
            self.client_config,
            {
                "group.id": "codeclog-listener",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # the live topic has no transactions: read_committed sees its records at once
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                # Latency: the broker answers a fetch as soon as
                # fetch.min.bytes (default 1) are readable (up to the last stable offset), so
                # fetch.wait.max.ms only bounds an idle fetch; 50 ms instead of 500 keeps
                # shutdown and caught_up() prompt. queued.min.messages is prefetch depth, not a
                # delay: default.
                "fetch.wait.max.ms": 50,
                # Memory: librdkafka prefetches up to 64 MB by default; a listener catching up
                # after an outage (both copies of a minute of audio from every stream) filled
                # it, and the soak saw its RSS step up at faults and stay (+9.8% over the
                # second half). 16 MB is still seconds of audio for every open stream.
                "queued.max.messages.kbytes": 16384,
            },
        )

    def start(self) -> None:
        """Find where to read from and assign the partitions. By default one scan of each
        partition up to its current end records, per request, the newest epoch and the offset
        where its records begin, and reading starts there, so a listener started mid-stream
        catches up from the start of each request's current epoch (older epochs are skipped);
        `StartMode.BEGINNING` delivers every epoch on the log, `StartMode.END` only what is
        written after the start."""
        if self._consumer is not None:
            return
        consumer = self._factory(self._config())
        try:
            places = self._places(consumer)
            starts: dict[TP, int] = {}
            if self.start_mode is StartMode.CURRENT_EPOCH:
                starts = self._scan(places)
            elif self.start_mode is StartMode.END:
                starts = {tp: _watermarks(consumer, TopicPartition(*tp))[1] for tp in places}
            self._starts = {tp: starts.get(tp, 0) for tp in places}
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in self._starts.items()])
        except KafkaException as exc:
            consumer.close()
            raise ListenerError(f"cannot read {self.topic}: {exc}") from exc
        self._consumer = consumer

    def _places(self, consumer: Any) -> list[TP]:
        """The (topic, partition)s to read: the live topic's first, when speculative and it
        exists (else a warning: the committed copies only)."""
        topics = [self.topic]
        if self.isolation is Isolation.SPECULATIVE:
            topics.insert(0, self.live_topic)
        places: list[TP] = []
        for topic in topics:
            if self._partitions is not None:
                places += [(topic, p) for p in self._partitions]
                continue
            try:
                places += [(topic, p) for p in _partitions_of(consumer, topic)]
            except ListenerError:
                if topic != self.live_topic:
                    raise
                log.warning("%s does not exist: hearing the committed audio only", topic)
        return places

    def _scan(self, places: Sequence[TP]) -> dict[TP, int]:
        """One pass over each partition up to its end now: per request the newest epoch and
        where its records begin in each partition; returns the offset each is read from."""
        scanner = self._factory(self._config())
        newest: dict[str, int] = {}  # request -> its newest epoch on any partition
        firsts: dict[tuple[TP, str], tuple[int, int]] = {}  # (tp, rid) -> (epoch, first offset)
        ends: dict[TP, int] = {}
        try:
            for topic, partition in places:
                low, high = _watermarks(scanner, TopicPartition(topic, partition))
                ends[(topic, partition)] = high
                if high <= low:
                    continue
                scanner.assign([TopicPartition(topic, partition, low)])
                for offset, key, value in _read_to_end(scanner, high):
                    if self._wanted and key not in self._wanted:
                        continue
                    chunk = _audio(value)
                    if chunk is None:
                        continue
                    rid, epoch = chunk.request_id, chunk.cache_epoch
                    newest[rid] = max(newest.get(rid, epoch), epoch)
                    known = firsts.get(((topic, partition), rid))
                    if known is None or epoch > known[0]:
                        firsts[((topic, partition), rid)] = (epoch, offset)
        finally:
            scanner.close()
        self.assembler.epoch_floor.update(newest)
        starts = dict(ends)
        for (tp, rid), (epoch, offset) in firsts.items():
            if epoch == newest[rid]:
                starts[tp] = min(starts[tp], offset)
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
                committed = message.topic() == self.topic
                out += self.assembler.offer(chunk, now, max(0, written_ms), committed)
        return out + self.assembler.expire(now)

    def caught_up(self) -> bool:
        """Read up to the high watermark of every partition as of now (with no transaction
        open on the audio topic: it cannot be read past the last stable offset)."""
        self.start()
        assignment = self._consumer.assignment()
        for tp in self._consumer.position(assignment):
            low, high = _watermarks(self._consumer, tp)
            # nothing consumed there yet: the position is unset, reading began at the start
            # offset (the partition's end at start when no current epoch lies in it)
            start = self._starts.get((tp.topic, tp.partition), low)
            position = tp.offset if tp.offset >= 0 else start
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
