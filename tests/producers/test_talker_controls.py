"""Talker: windowing + the control events it adds, against an in-memory sink."""

from __future__ import annotations

import pytest

from codeclog.producers.talker import Record, Talker
from codeclog.producers.windowing import InvalidStepError
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind


class ListSink:
    def __init__(self) -> None:
        self.records: list[Record] = []

    def publish(self, record: Record) -> None:
        self.records.append(record)


def talker(native_duplex: bool = False) -> tuple[Talker, ListSink]:
    sink = ListSink()
    return Talker(sink, producer_id="t1", native_duplex=native_duplex, clock_ms=lambda: 42), sink


def kinds(records: list[Record]) -> list[str]:
    out = []
    for record in records:
        if isinstance(record, ControlEvent):
            out.append(record.kind.value)
        else:
            out.append("last" if record.last_chunk else f"chunk{record.frames}")
    return out


def test_step_publishes_what_the_windowing_returns() -> None:
    t, sink = talker()
    for code in range(24):
        assert t.step("r", [code]) == []
    returned = t.step("r", [24])
    assert returned == sink.records
    chunk = sink.records[0]
    assert isinstance(chunk, CodecChunk)
    assert (chunk.request_id, chunk.produced_at_ms, chunk.producer_id) == ("r", 42, "t1")
    assert t.stats.chunks == 1 and t.stats.frames == 25
    assert t.stats.audio_seconds == pytest.approx(1.0)


def test_abort_of_a_live_stream_publishes_abort_once() -> None:
    t, sink = talker()
    t.step("r", range(10), internal_request_id="i0")
    t.step("r", [], aborted=True, finished=True, internal_request_id="i0")
    t.step("r", [], aborted=True, finished=True, internal_request_id="i0")  # stale: nothing
    assert kinds(sink.records) == ["abort"]
    assert t.stats.dropped_frames == 10


def test_finished_duplex_request_outside_a_turn_end_publishes_finish() -> None:
    t, sink = talker(native_duplex=True)
    t.step("r", range(7), text_utf8=b"hi")
    t.step("r", [], finished=True)
    assert kinds(sink.records) == ["chunk10", "finish"]
    finish = sink.records[1]
    assert isinstance(finish, ControlEvent)
    assert (finish.kind, finish.produced_at_ms, finish.producer_id) == (
        ControlKind.FINISH,
        42,
        "t1",
    )


def test_turn_end_needs_no_finish() -> None:
    t, sink = talker(native_duplex=True)
    t.step("r", range(7), finished=True, turn_end=True)
    assert kinds(sink.records) == ["last"]


def test_non_duplex_finish_is_a_last_chunk_not_a_control() -> None:
    t, sink = talker()
    t.step("r", range(30))
    t.step("r", [], finished=True)
    assert kinds(sink.records) == ["chunk28", "last"]


def test_requests_are_isolated_and_forgettable() -> None:
    t, sink = talker()
    a, b = t.stream("a"), t.stream("b")
    a.step(range(24))
    b.step(range(25))
    a.step([24])
    assert [r.request_id for r in sink.records] == ["b", "a"]
    t.forget("a")
    assert t.state("a") is None and t.state("b") is not None
    a.step(range(25))  # a forgotten request starts over
    last = sink.records[-1]
    assert isinstance(last, CodecChunk) and (last.cache_epoch, last.chunk_seq) == (0, 0)


def test_invalid_ids_raise_before_anything_is_published() -> None:
    t, sink = talker()
    with pytest.raises(InvalidStepError):
        t.step("r", [6561])
    assert sink.records == []
