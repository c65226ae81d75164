"""The capture's drain loop: consume the assigned spans of a topic into a capture writer.
Reasons: docs/replay.md, "Capture"."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from codeclog.kafka.access import is_authorization_error
from codeclog.replay.capture_format import (
    CapturedRecord,
    CaptureWriter,
    PartitionSpan,
    RecordHeader,
    TimestampType,
    fingerprint_of_value,
)
from codeclog.replay.errors import CaptureError


class Progress(Protocol):
    """Told after each batch: offsets done of the total to read, records written."""

    def update(self, done: int, total: int, written: int) -> None: ...

    def close(self) -> None: ...


def record_from_message(message: Any, observed_at_ms: int) -> CapturedRecord:
    """A consumed confluent_kafka.Message as a capture record (value kept byte for byte)."""
    ts_type, ts_ms = message.timestamp()
    value = message.value()
    headers = message.headers() or ()
    return CapturedRecord(
        topic=message.topic(),
        partition=message.partition(),
        offset=message.offset(),
        timestamp_ms=int(ts_ms),
        timestamp_type=TimestampType.from_kafka(ts_type),
        key=message.key(),
        value=value,
        headers=tuple(RecordHeader(str(k), v) for k, v in headers),
        schema_fingerprint=fingerprint_of_value(value),
        observed_at_ms=observed_at_ms,
        leader_epoch=_leader_epoch(message),
    )


def _leader_epoch(message: Any) -> int | None:
    epoch = getattr(message, "leader_epoch", None)
    value = epoch() if callable(epoch) else None
    return int(value) if isinstance(value, int) and value >= 0 else None


@dataclasses.dataclass
class _DrainState:
    """Mutable bookkeeping of one drain loop (local to `Drainer.run`)."""

    ends: dict[int, int]  # unfinished partition -> end offset (exclusive)
    positions: dict[int, int]  # partition -> next offset to read, as far as we know
    read: int = 0
    written: int = 0
    idle_since: float = 0.0


@dataclasses.dataclass(frozen=True)
class Drainer:
    """Consumes assigned spans into a writer. Time comes in as parameters (tests fake it)."""

    consumer: Any
    topic: str
    writer: CaptureWriter
    keep: Callable[[CapturedRecord], bool]
    clock_ms: Callable[[], int]
    monotonic: Callable[[], float]
    progress: Progress | None = None
    batch_size: int = 1000
    idle_timeout_s: float = 30.0

    def run(self, spans: Sequence[PartitionSpan]) -> tuple[int, int]:
        """Consume every span; returns (records read, records written)."""
        live = [s for s in spans if s.start < s.end]
        starts = {s.partition: s.start for s in live}
        state = _DrainState({s.partition: s.end for s in live}, dict(starts))
        state.idle_since = self.monotonic()
        self._assign(live)
        total = sum(s.end - s.start for s in live)
        while state.ends:
            progressed = self._batch(state)
            self._check_idle(state, progressed)
            if self.progress is not None:
                done = sum(state.positions[p] - starts[p] for p in starts)
                self.progress.update(min(done, total), total, state.written)
        if self.progress is not None:
            self.progress.close()
        return state.read, state.written

    def _assign(self, live: Sequence[PartitionSpan]) -> None:
        from confluent_kafka import TopicPartition

        if live:
            self.consumer.assign([TopicPartition(self.topic, s.partition, s.start) for s in live])

    def _batch(self, state: _DrainState) -> bool:
        messages = self.consumer.consume(num_messages=self.batch_size, timeout=0.2)
        now_ms = self.clock_ms()  # one clock read per batch
        for message in messages:
            _raise_on_error(message)
            end = state.ends.get(message.partition())
            if end is None or message.offset() >= end:
                continue  # appended after the capture started: outside the span
            record = record_from_message(message, now_ms)
            state.read += 1
            if self.keep(record):
                self.writer.write(record)
                state.written += 1
        if messages:
            self.writer.flush()  # one block per batch: a crash loses at most this batch
        advanced = self._finish_partitions(state)
        return bool(messages) or advanced

    def _finish_partitions(self, state: _DrainState) -> bool:
        """Drop partitions whose position reached the end (position steps over markers)."""
        from confluent_kafka import TopicPartition

        asked = [TopicPartition(self.topic, p) for p in sorted(state.ends)]
        advanced = False
        done = []
        for tp in self.consumer.position(asked):
            if tp.offset > state.positions[tp.partition]:
                state.positions[tp.partition] = tp.offset
                advanced = True
            if tp.offset >= state.ends[tp.partition]:
                done.append(tp)
        for tp in done:
            del state.ends[tp.partition]
        if done:
            self.consumer.pause(done)  # stop fetching what lies past the end
        return advanced

    def _check_idle(self, state: _DrainState, progressed: bool) -> None:
        now = self.monotonic()
        if progressed:
            state.idle_since = now
            return
        if state.ends and now - state.idle_since > self.idle_timeout_s:
            stuck = ", ".join(f"{p} at {state.positions[p]} of {e}" for p, e in state.ends.items())
            raise CaptureError(
                f"no progress for {self.idle_timeout_s:.0f} s on partition(s) {stuck}; the "
                "records may have been deleted by retention, or the broker is unreachable"
            )


class ReadRefused(Exception):
    """An authorisation refusal seen while reading; run_capture names principal and ACL."""

    def __init__(self, error: Any) -> None:
        super().__init__(error)
        self.error = error


def _raise_on_error(message: Any) -> None:
    error = message.error()
    if error is None:
        return
    if is_authorization_error(error):
        raise ReadRefused(error)
    raise CaptureError(f"the broker refused the capture: {error.str()}")
