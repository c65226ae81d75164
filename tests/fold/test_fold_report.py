"""The replay report's bookkeeping and the upstream error text."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from codeclog.consumers.stream.fold.outcomes import Reject, RejectReason, details_of
from codeclog.consumers.stream.fold.report import ReportBuilder, build_report, strict_error_json
from codeclog.consumers.stream.fold.state import FoldConfig, Policy
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind


def chunk(seq: int, rid: str = "r", n: int = 28, **kw: Any) -> CodecChunk:
    return dataclasses.replace(CodecChunk(rid, tuple(range(n)), chunk_seq=seq), **kw)


@pytest.mark.parametrize(
    ("reject", "text"),
    [
        (
            Reject(
                "b",
                RejectReason.CHUNK_BELOW_LOOKAHEAD_WINDOW,
                0,
                0,
                details_of(frames=1, minimum=4),
            ),
            '{"frames":1,"minimum":4,"reason":"chunk_below_lookahead_window"}',
        ),
        (
            Reject("r", RejectReason.STALE_CACHE_EPOCH, 1, 0, details_of(expected=2, actual=1)),
            '{"actual":1,"expected":2,"reason":"stale_cache_epoch"}',
        ),
        (
            Reject("r", RejectReason.EMPTY_NONFINAL_CHUNK, 0, 3, details_of(request_ids=("r",))),
            '{"reason":"empty_nonfinal_chunk","request_ids":["r"]}',
        ),
        (Reject("", RejectReason.MISSING_REQUEST_ID, 0, 0), '{"reason":"missing_request_id"}'),
    ],
    ids=["lookahead", "stale epoch", "empty non-final", "no details"],
)
def test_strict_error_json_is_the_upstream_text(reject: Reject, text: str) -> None:
    assert strict_error_json(reject) == text


@pytest.mark.parametrize(
    ("events", "statuses"),
    [
        ([chunk(0)], {"r": "open"}),
        ([chunk(0), chunk(1, last_chunk=True)], {"r": "released"}),
        ([chunk(0, codes=(9999,))], {"r": "released"}),
        ([chunk(0), ControlEvent("r", ControlKind.ABORT)], {"r": "released"}),
        ([ControlEvent("x", ControlKind.FINISH)], {"x": "released"}),
        ([chunk(0, rid="")], {"": "released"}),
        ([chunk(0, code_flat_numel=0)], {"r": "open"}),
    ],
    ids=["open", "released", "refused only", "aborted", "control only", "no id", "A3 opens"],
)
def test_tolerant_status(events: list[CodecChunk | ControlEvent], statuses: dict[str, str]) -> None:
    report = build_report(events)
    assert report["policy"] == "tolerant"
    assert {rid: entry["status"] for rid, entry in report["requests"].items()} == statuses


def test_strict_report_kills_open_streams_and_counts_the_rest() -> None:
    events = [
        chunk(0, rid="a"),
        chunk(0, rid="b"),
        chunk(1, rid="b", last_chunk=True),
        chunk(3, rid="c"),
        chunk(1, rid="a"),
    ]
    report = build_report(events, FoldConfig(policy=Policy.STRICT))
    assert report["events"] == 4 and report["unprocessed"] == 1
    assert report["stage"]["fatal"] == {
        "reason": "missing_state_for_chunk",
        "request_id": "c",
        "cache_epoch": 0,
        "chunk_seq": 3,
    }
    statuses = {rid: entry["status"] for rid, entry in report["requests"].items()}
    assert statuses == {"a": "killed", "b": "released", "c": "killed"}


def test_builder_matches_build_report_and_is_incremental() -> None:
    from codeclog.consumers.stream.fold.rules import fold
    from codeclog.consumers.stream.fold.state import new_state

    events = [chunk(0), chunk(2), chunk(2), chunk(3, last_chunk=True)]
    state, builder = new_state(), ReportBuilder(Policy.TOLERANT)
    for event in events:
        state, outcomes = fold(state, event)
        builder.add(event, outcomes)
    assert builder.result() == build_report(events)
    assert [o["kind"] for o in builder.result()["requests"]["r"]["outcomes"]] == [
        "decode",
        "gap",
        "decode",
        "duplicate",
        "decode",
        "release",
    ]
