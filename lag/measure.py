"""Lag measurements on a real cluster: offsets, time lag and audio lag for one group and topic.

What is read, per partition of the topic, in one `measure()` call:

* committed offset: `Consumer.committed()` of a consumer carrying the group's id, which never
  joins the group (negative = none: None here). Not `AdminClient.list_consumer_group_offsets`:
  librdkafka crashes the process (SIGSEGV) when a coordinator answers that with
  NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE (`CommittedReader`; docs/lag.md);
* end offset: the **last stable offset** (`list_offsets(..., isolation_level=READ_COMMITTED)`),
  because the vocoder reads read_committed: against the high watermark a fully consumed
  transactional topic would show lag 1 (the commit marker; librdkafka #2539, klag-exporter #104);
* earliest offset (`OffsetSpec.earliest()`), exported as `kafka_partition_earliest_offset`;
* group state and members (`describe_consumer_groups`), so an empty group is visible and each
  partition is known to be held by a live member or not (STOP vs STALL in the evaluator).

A partition the group never committed on still has a lag: it is measured from where the group
would start, its `auto.offset.reset` (`offset_reset`; earliest for codeclog's consumer: the
log start offset, so every retained record is waiting; latest: nothing is). Such a row says so
(`from_reset`, and `start_offset` is the reset position), and its time and audio lag come from
the records after the reset position like any other. Without this a stopped group hid every
partition it had never touched: new sessions there showed lag "-", were not counted, and the
group looked OK.

Lag counts the records a read_committed consumer still has to read: LSO - start, except
that when the head reader (below) reaches the end it counts the visible records exactly. This
matters on transactional input: right after the last record of a transaction, position() still
points at the commit marker until the consumer's next fetch steps over it (checked on Kafka
4.3.1 / librdkafka 2.16: record 10 consumed, position 11; after one more poll, 12). A consumer
that commits position() only together with its outputs would otherwise show lag 1 forever once
the topic goes idle, and the evaluator would call it STALL.

Time lag is read, not interpolated (kafka.md C.3): for each lagging partition a short-lived
read_committed consumer `assign()`s the start offset (committed, else the reset position) and
reads the first visible record;
time lag = now - that record's timestamp (clamped at 0). A caught-up partition has time lag 0.
If the reader reaches the end without a visible record (only commit markers or aborted records
are left) both time and audio lag are 0: nothing is waiting to be vocoded.

Whose clock: the record's Kafka timestamp, never the payload's produced_at_ms. On a chunk topic
made by `codeclog topics create` (message.timestamp.type=LogAppendTime) it is the time the
broker appended the record: a clock the cluster owns. On a topic that keeps CreateTime it is
the producer's clock, which may be anything (a talker stamping 1 ms after the epoch showed 57
years of lag and paged): such a timestamp counts only within [now - CREATE_TIME_MAX_AGE_MS,
now + CREATE_TIME_MAX_AHEAD_MS]; outside, the partition's time lag is unknown (None, an absent
series), so a wrong producer clock cannot page, while offset lag, audio lag and the group rules
still measure the backlog.

Audio lag estimates the seconds of codec frames in records not yet vocoded. The reader reads at
most `read_records` (K) records from the committed offset and counts each record's new frames
(`codec_chunk_frames`, else frames minus `codec_left_context_frames`; control events and
undecodable records count 0). If it reached the end of the partition, the sum is exact;
otherwise audio lag = mean new frames per record read x offset lag x 40 ms. Cost is bounded:
at most K records per lagging partition per measurement, and none when the cached read for the
same committed offset is still valid (it read K records, or the end offset has not moved).

Error of the audio estimate, stated so nobody mistakes it for exact:
* sampling: only the oldest K records are decoded; if the frames per record of the rest differ
  (a burst of short first chunks, long idle turn ends) the estimate is off by that difference
  times the records not read; with 25-frame chunks and K = 64 it is typically within 10 %;
* transaction markers and aborted records occupy offsets but carry no frames: the offset lag
  overcounts them, so the estimate is high by at most (markers + aborted) / lag (one marker per
  transaction, so about 1 / records per transaction);
* frames the consumer has already consumed but holds because a window was too short (at most
  L = 3 per request, fold rule A4) are not counted: low by at most 0.12 s per open request.

Unknown values are None, never NaN: the exporter turns None into an absent series.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    ConsumerGroupState,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from codeclog.errors import CodeclogError, UsageError
from codeclog.kafka.access import (
    is_authorization_error,
    principal_of,
    raise_if_topic_refused,
    refusal,
    refusal_of_unused,
)
from codeclog.kafka.log import client_settings
from codeclog.lag.describer import GroupDescriber
from codeclog.lag.evaluator import offset_lag
from codeclog.schemas import wire
from codeclog.schemas.records import FRAME_SECONDS, CodecChunk

DEFAULT_READ_RECORDS = 64  # K: records decoded per lagging partition for the audio estimate
DEFAULT_TIMEOUT_S = 10.0  # admin requests
DEFAULT_READ_TIMEOUT_S = 3.0  # the head reader, all partitions together
# A group coordinator that moves (a node restart) or has not loaded its __consumer_offsets
# partition yet (a fresh cluster) answers OffsetFetch with one of these; the consumer finds the
# coordinator again by itself, so the question is asked again until the timeout.
COORDINATOR_MOVING = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
COORDINATOR_RETRY_S = 0.2
OFFSET_RESETS = ("earliest", "latest")  # auto.offset.reset values a lag can be measured from
DEFAULT_OFFSET_RESET = "earliest"  # codeclog's consumer (consumers.member.service)
# A CreateTime (the producer's clock) is believed only this far ahead of the monitor's clock
# (skew) and this far behind it (Kafka's default retention, log.retention.hours=168).
CREATE_TIME_MAX_AHEAD_MS = 60_000
CREATE_TIME_MAX_AGE_MS = 7 * 24 * 3600 * 1000

FramesOf = Callable[[bytes | None], int]


def quiet(client_config: Mapping[str, str]) -> dict[str, Any]:
    """librdkafka logs every failed connect; the one-sentence error says it better.

    Level 2 (critical) like `codeclog topics`; a log_level in the user's config wins. The lines
    go to the `codeclog.kafka` logger (codeclog.kafka.log), never straight to stderr.
    """
    return client_settings({"log_level": "2"}, client_config)


class MeasureError(CodeclogError):
    """The cluster could not be asked (unreachable, unknown topic, request failed)."""


class ClientConfigError(MeasureError, UsageError):
    """The Kafka client configuration or a measurer setting is invalid (a usage error)."""


def new_frames(chunk: CodecChunk) -> int:
    """Frames a chunk adds to the stream: its new ids, not the repeated left context."""
    if chunk.codec_chunk_frames > 0:
        return chunk.codec_chunk_frames
    return max(0, chunk.frames - chunk.codec_left_context_frames)


def wire_frames_of(value: bytes | None) -> int:
    """New codec frames of a chunk-topic record value; 0 for control events and bad records."""
    try:
        record = wire.decode(value)
    except wire.DecodeError:
        return 0  # dead-lettered by the consumer: it will never become audio
    return new_frames(record) if isinstance(record, CodecChunk) else 0


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionMeasurement:
    """One partition of the measured topic for the measured group."""

    partition: int
    committed_offset: int | None  # None: the group has no committed offset here
    earliest_offset: int | None
    end_offset: int | None  # last stable offset
    lag: int | None  # records still to read (see `visible_lag`)
    time_lag_s: float | None
    audio_lag_s: float | None
    owned: bool | None  # a live member holds it; None when the group could not be described
    # where the lag is measured from: the committed offset, or the reset position when the group
    # has none here (`from_reset`); None when unknown
    start_offset: int | None = None
    from_reset: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class GroupMeasurement:
    """Everything measured for (group, topic) at `observed_at_ms`."""

    group: str
    topic: str
    observed_at_ms: int
    state: str | None  # ConsumerGroupState name (STABLE, EMPTY, DEAD, ...); None: unknown
    member_count: int | None  # None when the group could not be described
    partitions: tuple[PartitionMeasurement, ...]
    poll_time_ms: float  # how long the measurement took


@dataclasses.dataclass(frozen=True, slots=True)
class HeadRead:
    """What the reader saw from a committed offset onwards (cached per partition and offset)."""

    start_offset: int  # committed offset, or the reset position
    end_offset: int  # the LSO when it was read: a later read with the same end is identical
    first_timestamp_ms: int | None  # of the first visible record; None: none or no timestamp
    records: int  # visible records read
    frames: int  # new codec frames in them
    reached_end: bool  # the reader saw the partition's end: `frames` is the exact total
    # the first timestamp is the broker's (LogAppendTime), not a producer's (CreateTime)
    broker_time: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class HeadRequest:
    partition: int
    start_offset: int
    end_offset: int
    want_records: int


def visible_lag(offsets_lag: int, head: HeadRead | None) -> int:
    """Records a read_committed consumer still has to read.

    The offset lag also counts commit markers and aborted records. When the reader reached the
    end it knows the visible records exactly; in particular a consumer whose start offset
    points at a trailing commit marker (it committed position() right after the last record,
    before its fetcher stepped over the marker) has nothing left to read: lag 0, not 1.
    """
    if head is not None and head.reached_end:
        return min(offsets_lag, head.records)
    return offsets_lag


def time_lag_s(head: HeadRead, lag: int, now_ms: int) -> float | None:
    """now - the first waiting record's timestamp (clamped at 0); None when unknown: no
    timestamp, or a producer's CreateTime outside the plausible window (module docstring)."""
    if lag == 0 or (head.records == 0 and head.reached_end):
        return 0.0
    if head.first_timestamp_ms is None:
        return None
    age_ms = now_ms - head.first_timestamp_ms
    if not head.broker_time and not -CREATE_TIME_MAX_AHEAD_MS <= age_ms <= CREATE_TIME_MAX_AGE_MS:
        return None  # the producer's clock is wrong: nothing to tell, and nothing to page on
    return max(0.0, age_ms / 1000.0)


def audio_lag_s(head: HeadRead, lag: int) -> float | None:
    if lag == 0:
        return 0.0
    if head.reached_end:  # every visible record was read: the sum is exact
        return head.frames * FRAME_SECONDS
    if head.records == 0:
        return None
    return head.frames / head.records * lag * FRAME_SECONDS


def _reason(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return str(error.str()) if isinstance(error, KafkaError) else str(exc)


def _result(
    future: Future[Any],
    what: str,
    timeout_s: float,
    config: Mapping[str, Any] | None = None,
    doing: Mapping[str, str] | None = None,
) -> Any:
    try:
        return future.result(timeout=timeout_s)
    except KafkaException as exc:
        if (refused := refusal(exc, config, doing or {})) is not None:
            raise refused from exc
        raise MeasureError(f"cannot {what}: {_reason(exc)}") from exc
    except TimeoutError as exc:
        raise MeasureError(f"cannot {what}: no answer within {timeout_s:g} s") from exc


class HeadReader:
    """Reads the first records after committed offsets with a short-lived consumer per call."""

    def __init__(
        self,
        client_config: Mapping[str, str],
        frames_of: FramesOf,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = dict(client_config)
        self._frames_of = frames_of
        self._read_timeout_s = read_timeout_s
        self._monotonic = monotonic
        # Set when the broker refused the read (no READ ACL on the topic): time and audio lag
        # stay unknown, and the caller says why instead of waiting out read_timeout_s.
        self.refused: str | None = None

    def read(self, topic: str, requests: Sequence[HeadRequest]) -> dict[int, HeadRead]:
        """One HeadRead per request that got a visible record or reached the end."""
        if not requests:
            return {}
        consumer = Consumer(self._consumer_config())
        try:
            consumer.assign([TopicPartition(topic, r.partition, r.start_offset) for r in requests])
            return self._collect(consumer, topic, {r.partition: r for r in requests})
        finally:
            consumer.close()

    def _consumer_config(self) -> dict[str, Any]:
        return client_settings(
            self._config,
            {
                # a throw-away id: the reader never commits, so the group never exists
                "group.id": f"codeclog-lag-reader-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",  # a committed offset lost to retention
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 50,
            },
        )

    def _collect(
        self, consumer: Consumer, topic: str, pending: dict[int, HeadRequest]
    ) -> dict[int, HeadRead]:
        seen: dict[int, list[Message]] = {p: [] for p in pending}
        done: dict[int, HeadRead] = {}
        deadline = self._monotonic() + self._read_timeout_s
        while pending and self._monotonic() < deadline and self.refused is None:
            for message in consumer.consume(num_messages=500, timeout=0.1):
                self._take(consumer, topic, message, pending, seen, done)
        for partition in pending:  # out of time: keep what was read, if anything
            if seen[partition]:
                done[partition] = self._head(pending[partition], seen[partition], False)
        return done

    def _take(
        self,
        consumer: Consumer,
        topic: str,
        message: Message,
        pending: dict[int, HeadRequest],
        seen: dict[int, list[Message]],
        done: dict[int, HeadRead],
    ) -> None:
        partition = message.partition()
        if partition not in pending:
            return
        error = message.error()
        if error is not None and refusal_of_unused(error, ("topic",)):
            return  # the assign()-only head reader needs only the topic (READ)
        if error is not None and is_authorization_error(error):
            self.refused = (
                f"{principal_of(self._config)} may not READ topic {topic} "
                f"({error.name()}): time lag and audio lag are unknown; grant it with "
                "`codeclog acls apply --monitor-reads` if the monitor may read payloads"
            )
            return
        if error is not None and error.code() != KafkaError._PARTITION_EOF:
            return  # transient fetch errors: the deadline bounds the wait
        if error is None:
            seen[partition].append(message)
        at_end = error is not None
        if at_end or len(seen[partition]) >= pending[partition].want_records:
            done[partition] = self._head(pending.pop(partition), seen[partition], at_end)
            consumer.pause([TopicPartition(topic, partition)])

    def _head(self, request: HeadRequest, messages: list[Message], at_end: bool) -> HeadRead:
        first_ts: int | None = None
        ts_type = TIMESTAMP_NOT_AVAILABLE
        if messages:
            ts_type, ts_ms = messages[0].timestamp()
            first_ts = None if ts_type == TIMESTAMP_NOT_AVAILABLE or ts_ms < 0 else ts_ms
        return HeadRead(
            start_offset=request.start_offset,
            end_offset=request.end_offset,
            first_timestamp_ms=first_ts,
            records=len(messages),
            frames=sum(self._frames_of(m.value()) for m in messages),
            reached_end=at_end,
            broker_time=ts_type == TIMESTAMP_LOG_APPEND_TIME,
        )


class CommittedReader:
    """Committed offsets of consumer groups, each read by a consumer carrying that group's id.

    Why not `AdminClient.list_consumer_group_offsets`: when the group coordinator answers its
    OffsetFetch with NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE, librdkafka (2.16.0) asks the
    client's consumer group handle to find the coordinator again, and an AdminClient has none:
    a NULL dereference (rd_kafka_cgrp_op) in librdkafka's main thread kills the process with
    SIGSEGV, where faulthandler cannot report because librdkafka's threads block signals. A
    fresh cluster gives that answer to the first question about a group (the exporter's first
    measurement, with no vocoder yet), a node restart to later ones (docs/lag.md, "The
    exporter's SIGSEGV"). A consumer has that handle: it finds the coordinator again and
    `committed()` raises, so the question is asked again until the timeout. The consumer never
    subscribes, so it never joins the group and is never counted as a member.
    """

    def __init__(
        self,
        client_config: Mapping[str, Any],
        timeout_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = dict(client_config)
        self._timeout_s = timeout_s
        self._monotonic = monotonic
        self._consumers: dict[str, Consumer] = {}  # one per group, kept between measurements

    def read(self, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
        doing = {"group": f"DESCRIBE group {group}", "topic": f"DESCRIBE topic {topic}"}
        asked = [TopicPartition(topic, p) for p in partitions]
        offsets: dict[int, int | None] = {}
        for tp in self._committed(group, asked, doing):
            if tp.error is not None and (refused := refusal(tp.error, self._config, doing)):
                raise refused
            offsets[tp.partition] = tp.offset if tp.offset >= 0 and tp.error is None else None
        return offsets

    def _committed(
        self, group: str, asked: list[TopicPartition], doing: Mapping[str, str]
    ) -> list[TopicPartition]:
        consumer = self._consumer(group)
        deadline = self._monotonic() + self._timeout_s
        while True:
            left = deadline - self._monotonic()
            try:
                return list(consumer.committed(asked, timeout=max(left, 0.1)))
            except KafkaException as exc:
                if (refused := refusal(exc, self._config, doing)) is not None:
                    raise refused from exc
                error = exc.args[0] if exc.args else None
                moving = isinstance(error, KafkaError) and error.code() in COORDINATOR_MOVING
                if not moving or left <= COORDINATOR_RETRY_S:
                    raise MeasureError(
                        f"cannot list the offsets of group {group!r}: {_reason(exc)}"
                    ) from exc
            time.sleep(COORDINATOR_RETRY_S)

    def _consumer(self, group: str) -> Consumer:
        consumer = self._consumers.get(group)
        if consumer is None:
            settings = {
                "group.id": group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
            }
            try:
                consumer = Consumer(client_settings(self._config, settings))
            except KafkaException as exc:
                raise ClientConfigError(
                    f"invalid Kafka client configuration: {_reason(exc)}"
                ) from exc
            self._consumers[group] = consumer
        return consumer

    def close(self) -> None:
        for consumer in self._consumers.values():
            consumer.close()
        self._consumers.clear()


class LagMeasurer:
    """Measures (group, topic) lag with one AdminClient and one consumer per group (committed
    offsets: `CommittedReader`); caches head reads between calls."""

    def __init__(
        self,
        client_config: Mapping[str, str],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        read_records: int = DEFAULT_READ_RECORDS,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        frames_of: FramesOf = wire_frames_of,
        monotonic: Callable[[], float] = time.monotonic,
        offset_reset: str = DEFAULT_OFFSET_RESET,
    ) -> None:
        if read_records < 1:
            raise ClientConfigError(f"read_records must be >= 1, got {read_records}")
        if offset_reset not in OFFSET_RESETS:
            raise ClientConfigError(
                f"offset_reset must be one of {OFFSET_RESETS}, got {offset_reset!r}"
            )
        self.offset_reset = offset_reset
        client_config = quiet(client_config)
        try:
            self._admin = AdminClient(client_settings(client_config))
        except KafkaException as exc:  # e.g. an unknown property in --kafka-config
            raise ClientConfigError(f"invalid Kafka client configuration: {_reason(exc)}") from exc
        self._timeout_s = timeout_s
        self._read_records = read_records
        self._monotonic = monotonic
        self._reader = HeadReader(client_config, frames_of, read_timeout_s, monotonic)
        self._committed = CommittedReader(client_config, timeout_s, monotonic)
        self._config = dict(client_config)
        self._heads: dict[tuple[str, int], HeadRead] = {}
        self._describer = GroupDescriber(client_settings(client_config), timeout_s)

    @property
    def read_refusal(self) -> str | None:
        """Why time and audio lag are unknown, when the broker refused the head read."""
        return self._reader.refused

    def close(self) -> None:
        self._heads.clear()  # AdminClient has no close(); dropping the reference frees it
        self._describer.close()
        self._committed.close()

    def measure(self, group: str, topic: str, now_ms: int) -> GroupMeasurement:
        started = self._monotonic()
        partitions = self.partitions(topic)
        # describe first: a principal without DESCRIBE on the group gets the broker's refusal
        # from it at once (a consumer would wait out the timeout for a coordinator it may not
        # look up)
        state, members, owned = self.describe(group, topic)
        committed = self.committed_offsets(group, topic, partitions)
        earliest = self.offsets(topic, partitions, OffsetSpec.earliest())
        end = self.offsets(topic, partitions, OffsetSpec.latest())
        start = {p: self._start(committed.get(p), earliest.get(p), end.get(p)) for p in partitions}
        heads = self._heads_for(topic, partitions, start, end)
        rows = tuple(
            self._partition(p, committed, earliest, end, start, owned, heads, now_ms)
            for p in partitions
        )
        poll_time_ms = (self._monotonic() - started) * 1000.0
        return GroupMeasurement(group, topic, now_ms, state, members, rows, poll_time_ms)

    def partitions(self, topic: str) -> list[int]:
        try:
            metadata = self._admin.list_topics(timeout=self._timeout_s)  # never auto-creates
        except KafkaException as exc:
            raise MeasureError(f"cannot reach the cluster: {_reason(exc)}") from exc
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise_if_topic_refused(self._config, topic, self._timeout_s)
            raise MeasureError(
                f"topic {topic!r} does not exist (create it with `codeclog topics create`)"
            )
        return sorted(found.partitions)

    def committed_offsets(
        self, group: str, topic: str, partitions: Iterable[int]
    ) -> dict[int, int | None]:
        return self._committed.read(group, topic, partitions)

    def offsets(
        self, topic: str, partitions: Iterable[int], spec: OffsetSpec
    ) -> dict[int, int | None]:
        request = {TopicPartition(topic, p): spec for p in partitions}
        futures = self._admin.list_offsets(
            request,
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=self._timeout_s,
        )
        offsets: dict[int, int | None] = {}
        for tp, future in futures.items():
            info = _result(
                future,
                f"list the offsets of {topic}[{tp.partition}]",
                self._timeout_s,
                self._config,
                {"topic": f"DESCRIBE topic {topic}"},
            )
            offsets[tp.partition] = info.offset if info.offset >= 0 else None
        return offsets

    def _start(self, committed: int | None, earliest: int | None, end: int | None) -> int | None:
        """Where the group reads next: its committed offset, else its reset position."""
        if committed is not None:
            return committed
        return earliest if self.offset_reset == "earliest" else end

    def describe(self, group: str, topic: str) -> tuple[str | None, int | None, set[int] | None]:
        """(state, member count, partitions of `topic` held by members); Nones when unknown.

        A group the cluster does not know is DEAD with no members: Kafka 4.3 answers the classic
        DescribeGroups that way, the consumer-protocol describe with GROUP_ID_NOT_FOUND.
        Some clusters (librdkafka's mock) cannot describe groups; lag is still measurable, so
        this degrades to unknown instead of failing the measurement.

        The request is asked in a child process (`codeclog.lag.describer`): librdkafka aborts
        the process on some admin coordinator requests when the coordinator moves (#4605;
        issue 43's soak lost its exporter so twice: docs/lag.md). Only `timeout_s` is waited
        for the answer; while the child waits, or after it died, the group is unknown.
        """
        answer = self._describer.ask(group, topic)
        if answer is None:
            return None, None, None
        if answer[0] == "ok":
            _, state, members, owned = answer
            return _state_name(state), members, set(owned)
        _, code, reason = answer
        if code == KafkaError.GROUP_ID_NOT_FOUND:
            return "DEAD", 0, set()
        exc = KafkaException(KafkaError(code, reason))
        if refused := refusal(exc, self._config, {"group": f"DESCRIBE group {group}"}):
            raise refused from exc
        return None, None, None

    def _heads_for(
        self,
        topic: str,
        partitions: Sequence[int],
        start: Mapping[int, int | None],
        end: Mapping[int, int | None],
    ) -> dict[int, HeadRead]:
        requests: list[HeadRequest] = []
        heads: dict[int, HeadRead] = {}
        for p in partitions:
            c, e = start.get(p), end.get(p)
            if c is None or e is None or e <= c:
                self._heads.pop((topic, p), None)
                continue
            cached = self._heads.get((topic, p))
            if cached is not None and self._still_valid(cached, c, e):
                heads[p] = cached
            else:
                requests.append(HeadRequest(p, c, e, min(self._read_records, e - c)))
        for p, head in self._reader.read(topic, requests).items():
            self._heads[(topic, p)] = head
            heads[p] = head
        return heads

    def _still_valid(self, cached: HeadRead, start: int, end: int) -> bool:
        if cached.start_offset != start:
            return False
        return cached.end_offset == end or cached.records >= self._read_records

    @staticmethod
    def _partition(
        p: int,
        committed: Mapping[int, int | None],
        earliest: Mapping[int, int | None],
        end: Mapping[int, int | None],
        start: Mapping[int, int | None],
        owned: set[int] | None,
        heads: Mapping[int, HeadRead],
        now_ms: int,
    ) -> PartitionMeasurement:
        c, e, s = committed.get(p), end.get(p), start.get(p)
        lag = offset_lag(s, e)
        head = heads.get(p)
        t_lag = a_lag = None
        if lag is not None:
            lag = visible_lag(lag, head)
        if lag == 0:
            t_lag = a_lag = 0.0
        elif lag is not None and head is not None:
            t_lag, a_lag = time_lag_s(head, lag, now_ms), audio_lag_s(head, lag)
        return PartitionMeasurement(
            partition=p,
            committed_offset=c,
            earliest_offset=earliest.get(p),
            end_offset=e,
            lag=lag,
            time_lag_s=t_lag,
            audio_lag_s=a_lag,
            owned=None if owned is None else p in owned,
            start_offset=s,
            from_reset=c is None and s is not None,
        )


def _state_name(state: ConsumerGroupState | str | int | None) -> str | None:
    if isinstance(state, ConsumerGroupState):
        return state.name
    return None if state is None else str(state)
