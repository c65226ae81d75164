"""Round trips of every record type, and what the decoder does with damaged encodings."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import pytest
from fastavro import schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codeclog.schemas import catalog, wire
from codeclog.schemas.records import (
    AudioChunk,
    CodecChunk,
    ControlEvent,
    ControlKind,
    DeadLetter,
    HandOutEnd,
    HandOutMark,
    HandOutMove,
    StreamCheckpoint,
    slot_constructor,
    to_dict,
)
from codeclog.testing.upstream_streams import preroll_window
from tests.schemas.refusal import assert_refused
from tests.schemas.strategies import (
    codec_chunks,
    records,
)

FIRST_WINDOW = preroll_window(
    "req-1", range(100, 125), produced_at_ms=1_760_000_000_000, producer_id="talker-0"
)

EXAMPLES: dict[str, catalog.Record] = {
    "first_window": FIRST_WINDOW,
    "stripped_metadata": CodecChunk(request_id="b", codes=(0,)),
    "boundary_placeholder": CodecChunk("r", (0,), chunk_seq=4, code_flat_numel=0),
    "missing_request_id": CodecChunk(request_id="", codes=()),
    "chunk_zero_with_voice": CodecChunk(
        "r", (1, 2, 3, 4), ref_audio=b"\x00\x00\x80?", ref_audio_sr=16000, prompt_cache_id="v"
    ),
    "duplex_turn_end": CodecChunk(
        "r",
        (7, 8, 9),
        cache_epoch=3,
        chunk_seq=9,
        last_chunk=True,
        tts_is_last_chunk=True,
        turn_end=True,
        duplex_epoch=2,
        duplex_turn_id=11,
        llm_output_text_utf8="ça va".encode(),
        streaming_condition_seq=41,
    ),
    "abort": ControlEvent("r", ControlKind.ABORT, reason="ABORTED", produced_at_ms=5),
    "finish": ControlEvent("r", ControlKind.FINISH),
    "audio": AudioChunk("r", 0, (0, 1), 0, 0, 24000, b"\x01\x00" * 960, "ab" * 32, False),
    "final_audio": AudioChunk("r", 1, (), 3, 72000, 24000, b"", "", True, turn_end=True),
    "decode_dead_letter": DeadLetter("malformed", "codec.chunks", 3, 2**40, b"\xc3\x01\x00"),
    "fold_dead_letter": DeadLetter(
        "stale_cache_epoch",
        "codec.chunks",
        0,
        17,
        b"...",
        raw_key=b"r",
        request_id="r",
        cache_epoch=1,
        chunk_seq=0,
        details_json='{"actual":1,"expected":2}',
    ),
    "handout_mark": HandOutMark(
        "r", "code2wav-replica0", "codec.chunks", 2, 4096, HandOutEnd.TIMED_OUT, 5, "omni-7"
    ),
    "handout_move": HandOutMove("r", "code2wav-replica0", "codec.chunks", 5, "orchestrator-7"),
    "checkpoint": StreamCheckpoint(
        "r", "codec.chunks", 5, True, 2, 1200, 1234, 7, 168000, fold_state_json="{}"
    ),
}


@pytest.mark.parametrize("record", EXAMPLES.values(), ids=EXAMPLES.keys())
def test_example_round_trips_with_its_latest_fingerprint(record: catalog.Record) -> None:
    data = wire.encode(record)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == catalog.fingerprint_of(type(record))
    decoded = wire.decode(data)
    assert decoded == record
    assert type(decoded) is type(record)


@given(records)
def test_any_record_round_trips(record: catalog.Record) -> None:
    decoded = wire.decode(wire.encode(record))
    assert decoded == record
    assert to_dict(decoded) == to_dict(record)


def test_decoded_sequences_are_tuples_and_enums_are_enums() -> None:
    chunk = wire.decode(wire.encode(FIRST_WINDOW))
    event = wire.decode(wire.encode(EXAMPLES["abort"]))
    assert isinstance(chunk, CodecChunk) and isinstance(chunk.codes, tuple)
    assert isinstance(event, ControlEvent) and event.kind is ControlKind.ABORT
    hash(chunk)  # frozen value objects are hashable: usable as dict keys and in sets


def test_decode_accepts_bytearray_and_memoryview() -> None:
    data = wire.encode(FIRST_WINDOW)
    assert wire.decode(bytearray(data)) == FIRST_WINDOW
    assert wire.decode(memoryview(data)) == FIRST_WINDOW


def _v1_bytes(chunk: CodecChunk) -> bytes:
    """What a producer still on codec_chunk.v1 writes: the v1 fingerprint, the v1 fields."""
    v1 = next(v for v in catalog.registry().versions if v.label == "codec_chunk.v1")
    values = {k: v for k, v in to_dict(chunk).items() if k != "streaming_condition_seq"}
    buffer = io.BytesIO()
    buffer.write(wire.MARKER + v1.fingerprint)
    schemaless_writer(buffer, v1.parsed, values)
    return buffer.getvalue()


@given(codec_chunks)
def test_v1_written_chunk_reads_into_latest_with_new_field_default(chunk: CodecChunk) -> None:
    data = _v1_bytes(chunk)
    assert catalog.known_fingerprints()[data[2:10].hex()] == "codec_chunk.v1"
    decoded = wire.decode(data)
    assert decoded == dataclasses.replace(chunk, streaming_condition_seq=None)


def _assert_only_decode_error(data: bytes) -> catalog.Record | None:
    """Decoding yields a valid record or a DecodeError that kept the exact input."""
    try:
        record = wire.decode(data)
    except wire.DecodeError as exc:
        assert exc.raw == data
        assert isinstance(exc.reason, wire.DecodeReason)
        assert str(exc).startswith("cannot decode")
        return None
    wire.encode(record)  # whatever decodes is a valid record: it encodes again
    return record


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    data = bytearray(wire.encode(draw(records)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["flip", "set", "insert", "delete", "cut"]))
        if action == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif action == "set" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif action == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=12))
        elif action == "delete":
            del data[at : at + draw(st.integers(1, 12))]
        elif action == "cut":
            del data[at:]
    return bytes(data)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(damaged())
def test_damaged_encodings_decode_or_raise_only_decode_error(data: bytes) -> None:
    _assert_only_decode_error(data)


@given(records)
def test_every_truncation_of_a_valid_encoding_is_a_decode_error(record: catalog.Record) -> None:
    data = wire.encode(record)
    for end in range(len(data)):
        with pytest.raises(wire.DecodeError) as caught:
            wire.decode(data[:end])
        assert caught.value.raw == data[:end]
        assert caught.value.reason in {
            wire.DecodeReason.EMPTY,
            wire.DecodeReason.TRUNCATED,
            wire.DecodeReason.MALFORMED,  # fastavro reports a varint cut mid-way as IndexError
        }


@given(records, st.binary(min_size=1, max_size=8))
def test_bytes_after_a_complete_record_are_refused(record: catalog.Record, extra: bytes) -> None:
    with pytest.raises(wire.DecodeError) as caught:
        wire.decode(wire.encode(record) + extra)
    assert caught.value.reason is wire.DecodeReason.TRAILING_BYTES


@given(records, st.binary(min_size=8, max_size=8))
def test_unknown_fingerprint_is_named(record: catalog.Record, fingerprint: bytes) -> None:
    if fingerprint.hex() in catalog.known_fingerprints():
        return
    data = wire.encode(record)
    forged = data[:2] + fingerprint + data[10:]
    with pytest.raises(wire.DecodeError) as caught:
        wire.decode(forged)
    assert caught.value.reason is wire.DecodeReason.UNKNOWN_FINGERPRINT
    assert caught.value.raw == forged
    assert fingerprint.hex() in str(caught.value)


def _forged_chunk(field: str, avro_type: Any, value: Any) -> bytes:
    """A codec chunk whose `field` was written as `avro_type`: a writer that breaks the schema.

    Same header as a genuine latest chunk, so the decoder must catch the damage in the body.
    """
    latest = catalog.registry().latest["codec_chunk"]
    schema = {
        "type": "record",
        "name": "Forged",
        "fields": [
            {"name": f["name"], "type": avro_type if f["name"] == field else f["type"]}
            for f in latest.parsed["fields"]
        ],
    }
    values = {**to_dict(FIRST_WINDOW), field: value}
    buffer = io.BytesIO()
    buffer.write(wire.MARKER + latest.fingerprint)
    schemaless_writer(buffer, schema, values)
    return buffer.getvalue()


FORGED = {
    "chunk_seq_above_int32": (_forged_chunk("chunk_seq", "long", 2**31), "invalid_value"),
    "chunk_seq_below_int32": (_forged_chunk("chunk_seq", "long", -(2**31) - 1), "invalid_value"),
    "code_above_int32": (
        _forged_chunk("codes", {"type": "array", "items": "long"}, [1, 2**40, 3]),
        "invalid_value",
    ),
    "nullable_int_above_int32": (
        _forged_chunk("code_flat_numel", ["null", "long"], 2**35),
        "invalid_value",
    ),
    "request_id_not_utf8": (_forged_chunk("request_id", "bytes", b"\xff\xfe"), "malformed"),
    "union_index_out_of_range": (
        _forged_chunk("code_flat_numel", ["null", "int", "string"], "x"),
        "malformed",
    ),
    # fastavro reads a negative length as "the rest", then runs out of bytes
    "negative_string_length": (_forged_chunk("request_id", "long", -5), "truncated"),
    "string_longer_than_value": (_forged_chunk("request_id", "long", 10_000), "truncated"),
}


@pytest.mark.parametrize("case", FORGED, ids=FORGED.keys())
def test_forged_body_is_refused_with_its_reason(case: str) -> None:
    assert_refused(*FORGED[case])


def test_a_genuine_forgery_writer_is_not_refused() -> None:
    """Control for the table above: the forging helper alone does not break decoding."""
    decoded = wire.decode(_forged_chunk("chunk_seq", "long", 2**31 - 1))
    assert decoded == dataclasses.replace(FIRST_WINDOW, chunk_seq=2**31 - 1)


def test_slot_constructor_builds_what_init_builds_and_refuses_other_types() -> None:
    construct = slot_constructor(DeadLetter)
    letter = DeadLetter("malformed", "codec.chunks", 3, 2**40, b"\xc3\x01\x00")
    values = [getattr(letter, f.name) for f in dataclasses.fields(DeadLetter)]
    built = construct(*values)
    assert type(built) is DeadLetter and built == letter and hash(built) == hash(letter)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.reason = "other"

    @dataclasses.dataclass(frozen=True)
    class Unslotted:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            pass

    for refused in (Unslotted, Checked):
        with pytest.raises(TypeError, match="slotted record"):
            slot_constructor(refused)
