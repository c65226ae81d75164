"""The Kafka readers behind a lag measurement: committed offsets (`CommittedReader`) and the records
after them (`HeadReader`); `MeasureError` and `ClientConfigError` say the cluster could not be
asked. Reasons: docs/lag.md, "The exporter's SIGSEGV"."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from codeclog.errors import CodeclogError, UsageError
from codeclog.kafka.access import (
    is_authorization_error,
    principal_of,
    refusal,
    refusal_of_unused,
)
from codeclog.kafka.log import client_settings
from codeclog.lag.arithmetic import FramesOf, HeadRead

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


class MeasureError(CodeclogError):
    """The cluster could not be asked (unreachable, unknown topic, request failed)."""


class ClientConfigError(MeasureError, UsageError):
    """The Kafka client configuration or a measurer setting is invalid (a usage error)."""


@dataclasses.dataclass(frozen=True, slots=True)
class HeadRequest:
    """Read `partition` from `start_offset`: at most `want_records` visible records."""

    partition: int
    start_offset: int
    end_offset: int
    want_records: int


def reason_of(exc: KafkaException) -> str:
    """The broker's words for a failed request (librdkafka's error string)."""
    error = exc.args[0] if exc.args else None
    return str(error.str()) if isinstance(error, KafkaError) else str(exc)


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
                        f"cannot list the offsets of group {group!r}: {reason_of(exc)}"
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
                    f"invalid Kafka client configuration: {reason_of(exc)}"
                ) from exc
            self._consumers[group] = consumer
        return consumer

    def close(self) -> None:
        for consumer in self._consumers.values():
            consumer.close()
        self._consumers.clear()
