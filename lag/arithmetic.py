"""The lag arithmetic: what one measurement is, and how offsets and a head read make it.

No Kafka client here: `lag.readers` reads the cluster, `lag.measure` puts the two together.

Lag counts the records a read_committed consumer still has to read: LSO - start, except that
when the head reader (`lag.readers.HeadReader`) reaches the end it counts the visible records
exactly (`visible_lag`). This matters on transactional input: right after the last record of a
transaction, position() still points at the commit marker until the consumer's next fetch steps
over it (checked on Kafka 4.3.1 / librdkafka 2.16: record 10 consumed, position 11; after one
more poll, 12). A consumer that commits position() only together with its outputs would
otherwise show lag 1 forever once the topic goes idle, and the evaluator would call it STALL.

Time lag is read, not interpolated (docs/lag.md): for each lagging partition a short-lived
read_committed consumer `assign()`s the start offset (committed, else the reset position) and
reads the first visible record (a `HeadRead`); time lag = now - that record's timestamp (clamped
at 0). A caught-up partition has time lag 0. If the reader reaches the end without a visible
record (only commit markers or aborted records are left) both time and audio lag are 0: nothing
is waiting to be vocoded.

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
