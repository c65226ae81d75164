"""Lag measurements on a real cluster: offsets, time lag and audio lag for one group and topic.
What is read and why: docs/lag.md, "What is read"."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from confluent_kafka import (
    ConsumerGroupState,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from codeclog.kafka.access import raise_if_topic_refused, refusal
from codeclog.kafka.log import client_settings
from codeclog.lag.arithmetic import (
    FramesOf,
    GroupMeasurement,
    HeadRead,
    partition_measurement,
    wire_frames_of,
)
from codeclog.lag.describer import GroupDescriber
from codeclog.lag.readers import (
    DEFAULT_READ_TIMEOUT_S,
    ClientConfigError,
    CommittedReader,
    HeadReader,
    HeadRequest,
    MeasureError,
    reason_of,
)

DEFAULT_READ_RECORDS = 64  # K: records decoded per lagging partition for the audio estimate
DEFAULT_TIMEOUT_S = 10.0  # admin requests
OFFSET_RESETS = ("earliest", "latest")  # auto.offset.reset values a lag can be measured from
DEFAULT_OFFSET_RESET = "earliest"  # codeclog's consumer (consumers.member.service)


def quiet(client_config: Mapping[str, str]) -> dict[str, Any]:
    """librdkafka logs every failed connect; the one-sentence error says it better.

    Level 2 (critical) like `codeclog topics`; a log_level in the user's config wins. The lines
    go to the `codeclog.kafka` logger (codeclog.kafka.log), never straight to stderr.
    """
    return client_settings({"log_level": "2"}, client_config)


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
        raise MeasureError(f"cannot {what}: {reason_of(exc)}") from exc
    except TimeoutError as exc:
        raise MeasureError(f"cannot {what}: no answer within {timeout_s:g} s") from exc


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
            raise ClientConfigError(
                f"invalid Kafka client configuration: {reason_of(exc)}"
            ) from exc
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
            partition_measurement(p, committed, earliest, end, start, owned, heads, now_ms)
            for p in partitions
        )
        poll_time_ms = (self._monotonic() - started) * 1000.0
        return GroupMeasurement(group, topic, now_ms, state, members, rows, poll_time_ms)

    def partitions(self, topic: str) -> list[int]:
        try:
            metadata = self._admin.list_topics(timeout=self._timeout_s)  # never auto-creates
        except KafkaException as exc:
            raise MeasureError(f"cannot reach the cluster: {reason_of(exc)}") from exc
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
        the hour-long soak lost its exporter so twice: docs/lag.md). Only `timeout_s` is waited
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


def _state_name(state: ConsumerGroupState | str | int | None) -> str | None:
    if isinstance(state, ConsumerGroupState):
        return state.name
    return None if state is None else str(state)
