"""The lag arithmetic: what one measurement is, and how offsets and a head read make it; no Kafka
client. Reasons: docs/lag.md, "Lag, time lag and audio lag"."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from codeclog.lag.evaluator import offset_lag
from codeclog.schemas import wire
from codeclog.schemas.records import FRAME_SECONDS, CodecChunk

# A CreateTime (the producer's clock) is believed only this far ahead of the monitor's clock
# (skew) and this far behind it (Kafka's default retention, log.retention.hours=168).
CREATE_TIME_MAX_AHEAD_MS = 60_000
CREATE_TIME_MAX_AGE_MS = 7 * 24 * 3600 * 1000

FramesOf = Callable[[bytes | None], int]


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
    timestamp, or a producer's CreateTime outside the plausible window (docs/lag.md, "Time lag
    is on the broker's clock")."""
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


def partition_measurement(
    p: int,
    committed: Mapping[int, int | None],
    earliest: Mapping[int, int | None],
    end: Mapping[int, int | None],
    start: Mapping[int, int | None],
    owned: set[int] | None,
    heads: Mapping[int, HeadRead],
    now_ms: int,
) -> PartitionMeasurement:
    """Partition `p`'s row from the offsets read for it and its head read, if any."""
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
