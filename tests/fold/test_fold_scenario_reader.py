"""The JSONL scenario format: defaults, control events, comments and line-numbered errors."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from codeclog.errors import CodeclogError
from codeclog.replay.scenario import (
    ScenarioError,
    event_to_json,
    parse_scenario,
    read_scenario,
    write_scenario,
)
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind


def test_missing_fields_take_the_upstream_defaults() -> None:
    (event,) = parse_scenario(['{"request_id": "b", "codes": [0]}'])
    assert event == CodecChunk(request_id="b", codes=(0,))
    assert isinstance(event, CodecChunk) and event.frames == 1  # numel defaults to len(codes)
    assert (event.cache_epoch, event.chunk_seq, event.duplex_epoch) == (0, 0, -1)
    (anonymous,) = parse_scenario(['{"codes": [1, 2, 3, 4], "duplex_turn_id": null}'])
    assert anonymous == CodecChunk(request_id="", codes=(1, 2, 3, 4))  # the fold refuses it


def test_comments_blank_lines_and_control_events() -> None:
    lines = [
        '{"comment": "a capture"}',
        "",
        '{"codes": [1, 2, 3, 4], "request_id": "r", "comment": "annotated"}',
        '{"control": "abort", "request_id": "r", "reason": "ABORTED"}',
        '{"control": "finish", "request_id": "s"}',
    ]
    events = parse_scenario(lines)
    assert events == [
        CodecChunk(request_id="r", codes=(1, 2, 3, 4)),
        ControlEvent(request_id="r", kind=ControlKind.ABORT, reason="ABORTED"),
        ControlEvent(request_id="s", kind=ControlKind.FINISH),
    ]


def test_readable_byte_fields() -> None:
    line = '{"codes": [1], "llm_output_text_utf8": "héllo", "ref_audio": [0.5, -1]}'
    (event,) = parse_scenario([line])
    assert isinstance(event, CodecChunk)
    assert event.llm_output_text_utf8 == "héllo".encode()
    assert event.ref_audio == struct.pack("<2f", 0.5, -1.0)
    (as_bytes,) = parse_scenario(['{"codes": [1], "llm_output_text_utf8": [104, 105]}'])
    assert isinstance(as_bytes, CodecChunk) and as_bytes.llm_output_text_utf8 == b"hi"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"request_id": "r"}', "needs `codes`"),
        ('{"codes": [1], "chunk_seq": "3"}', "expected an integer"),
        ('{"codes": [1], "chunk_seq": 1.0}', "expected an integer"),
        ('{"codes": [1], "last_chunk": 1}', "expected true or false"),
        ('{"codes": [1, "2"]}', "expected an integer"),
        ('{"codes": "1"}', "codes must be a list"),
        ('{"codes": [1], "cache_epoch": true}', "expected an integer"),
        ('{"codes": [1], "chunk_sequence": 2}', "unknown codec chunk field(s): chunk_sequence"),
        ('{"control": "pause", "request_id": "r"}', "control must be one of abort, finish"),
        ('{"control": "abort", "codes": [1]}', "unknown control field(s): codes"),
        ('{"codes": [1], "llm_output_text_utf8": [256]}', "llm_output_text_utf8 must be"),
        ('{"codes": [1], "ref_audio": [NaN]}', "finite number"),
    ],
    ids=lambda value: value if len(value) < 40 else value[:40],
)
def test_wrong_types_raise_a_scenario_error_naming_the_line(line: str, message: str) -> None:
    with pytest.raises(ScenarioError) as raised:
        parse_scenario(['{"comment": "first"}', line], "capture.jsonl")
    assert isinstance(raised.value, CodeclogError)
    assert raised.value.line == 2
    assert str(raised.value).startswith("capture.jsonl:2: ")
    assert message in str(raised.value)


def test_unreadable_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        read_scenario(tmp_path / "missing.jsonl")


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    events: list[CodecChunk | ControlEvent] = [
        CodecChunk(
            request_id="r",
            codes=(4218, 4218, 4218, 5),
            chunk_seq=3,
            code_flat_numel=4,
            last_chunk=True,
            llm_output_text_utf8=b"ok",
            duplex_turn_id=2,
            ref_audio=struct.pack("<1f", 0.25),
            ref_audio_sr=24000,
        ),
        CodecChunk(request_id="r", codes=(1,), llm_output_text_utf8=b"\xff"),
        ControlEvent(request_id="r", kind=ControlKind.FINISH, produced_at_ms=5),
    ]
    path = tmp_path / "round.jsonl"
    write_scenario(path, events)
    assert read_scenario(path) == events
    assert event_to_json(events[0])["code_flat_numel"] == 4
    assert "cache_epoch" not in event_to_json(events[0])  # defaults are omitted


def test_the_shipped_scenarios_parse() -> None:
    folder = Path(__file__).resolve().parents[1] / "data" / "scenarios"
    for path in sorted(folder.glob("*.jsonl")):
        assert read_scenario(path), path
