"""Pure parts of the lag measurement: frames per chunk, time lag and audio lag from a head read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codeclog.lag.arithmetic import (
    CREATE_TIME_MAX_AGE_MS,
    HeadRead,
    audio_lag_s,
    new_frames,
    time_lag_s,
    visible_lag,
    wire_frames_of,
)
from codeclog.lag.measure import quiet
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind

NEW_FRAMES = [
    ("declared_chunk_frames", CodecChunk("r", tuple(range(28)), codec_chunk_frames=25), 25),
    (
        "context_subtracted_when_undeclared",
        CodecChunk("r", tuple(range(28)), codec_left_context_frames=3),
        25,
    ),
    ("first_window_without_context", CodecChunk("r", tuple(range(10))), 10),
    ("boundary_placeholder", CodecChunk("r", (0,), code_flat_numel=0), 0),
    (
        "context_longer_than_window_clamps",
        CodecChunk("r", (1, 2), codec_left_context_frames=3),
        0,
    ),
]


@pytest.mark.parametrize(("name", "chunk", "expected"), NEW_FRAMES, ids=[c[0] for c in NEW_FRAMES])
def test_new_frames(name: str, chunk: CodecChunk, expected: int) -> None:
    assert new_frames(chunk) == expected


WIRE_FRAMES = [
    ("codec_chunk", wire.encode(CodecChunk("r", tuple(range(28)), codec_chunk_frames=25)), 25),
    ("control_event", wire.encode(ControlEvent("r", ControlKind.FINISH)), 0),
    ("garbage_is_dead_lettered", b"\x00not avro", 0),
    ("tombstone", None, 0),
]


@pytest.mark.parametrize(
    ("name", "value", "expected"), WIRE_FRAMES, ids=[c[0] for c in WIRE_FRAMES]
)
def test_wire_frames_of(name: str, value: bytes | None, expected: int) -> None:
    assert wire_frames_of(value) == expected


NOW_MS = 1_700_000_010_000


DAY_MS = 24 * 3600 * 1000


def head(
    records: int,
    frames: int,
    reached_end: bool,
    ts: int | None = 1_700_000_000_000,
    broker_time: bool = False,
) -> HeadRead:
    first = ts if records else None
    return HeadRead(100, 200, first, records, frames, reached_end, broker_time=broker_time)


LAGS = [
    # name, head, offset lag, expected time lag s, expected audio lag s
    ("caught_up", head(0, 0, True), 0, 0.0, 0.0),
    ("sampled_extrapolates", head(4, 100, False), 40, 10.0, 40 * 25 * 0.04),
    ("read_to_end_is_exact", head(3, 60, True), 5, 10.0, 60 * 0.04),
    ("only_markers_left", head(0, 0, True), 1, 0.0, 0.0),
    ("nothing_read_in_time", head(0, 0, False), 10, None, None),
    ("no_timestamp", head(2, 50, False, ts=None), 10, None, 10.0),
    ("clock_skew_clamps_at_zero", head(1, 25, False, ts=NOW_MS + 5_000), 10, 0.0, 10.0),
    # whose clock (issue 29): a producer's CreateTime counts only within [-7 days, +60 s]
    ("producer_clock_at_the_epoch_is_unknown", head(1, 25, False, ts=1), 10, None, 10.0),
    (
        "producer_clock_hours_ahead_is_unknown",
        head(1, 25, False, ts=NOW_MS + 3_600_000),
        10,
        None,
        10.0,
    ),
    (
        "producer_clock_six_days_back_counts",
        head(1, 25, False, ts=NOW_MS - 6 * DAY_MS),
        10,
        6 * DAY_MS / 1000,
        10.0,
    ),
    (
        "broker_clock_always_counts",
        head(1, 25, False, ts=NOW_MS - 8 * DAY_MS, broker_time=True),
        10,
        8 * DAY_MS / 1000,
        10.0,
    ),
    (
        "broker_clock_skew_clamps_at_zero",
        head(1, 25, False, ts=NOW_MS + 3_600_000, broker_time=True),
        10,
        0.0,
        10.0,
    ),
]


@pytest.mark.parametrize(("name", "read", "lag", "t_lag", "a_lag"), LAGS, ids=[c[0] for c in LAGS])
def test_lags_from_head(
    name: str, read: HeadRead, lag: int, t_lag: float | None, a_lag: float | None
) -> None:
    assert time_lag_s(read, lag, NOW_MS) == t_lag
    got = audio_lag_s(read, lag)
    assert got == (None if a_lag is None else pytest.approx(a_lag))


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_no_producer_clock_makes_a_time_lag_beyond_the_window(stamp_ms: int) -> None:
    """Whatever a producer stamps (CreateTime), the time lag is unknown or at most the
    plausible window: a wrong clock can never page with decades of lag."""
    got = time_lag_s(head(1, 25, False, ts=stamp_ms), 10, NOW_MS)
    assert got is None or 0.0 <= got <= CREATE_TIME_MAX_AGE_MS / 1000


def test_quiet_keeps_the_users_log_level() -> None:
    assert quiet({"bootstrap.servers": "x"})["log_level"] == "2"
    assert quiet({"bootstrap.servers": "x", "log_level": "7"})["log_level"] == "7"


VISIBLE = [
    ("no_head_read_keeps_offset_lag", 5, None, 5),
    ("sampled_head_keeps_offset_lag", 50, head(4, 100, False), 50),
    ("trailing_commit_marker_is_not_lag", 1, head(0, 0, True), 0),
    ("markers_between_records_are_not_lag", 7, head(5, 125, True), 5),
]


@pytest.mark.parametrize(
    ("name", "offsets", "read", "expected"), VISIBLE, ids=[c[0] for c in VISIBLE]
)
def test_visible_lag(name: str, offsets: int, read: HeadRead | None, expected: int) -> None:
    assert visible_lag(offsets, read) == expected
