"""The bulk decoder (schemas.columnar) equals `wire.decode` value by value, errors included:
valid records, older writers, other record types and every kind of damage."""

from __future__ import annotations

import dataclasses
import io
import json
import random
from typing import Any

from fastavro import parse_schema, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.schemas import catalog, wire
from codeclog.schemas.columnar import decode_values
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind, to_dict
from codeclog.testing.upstream_streams import realistic_events
from tests.schemas.strategies import audio_chunks, codec_chunks, control_events


def _outcome(value: bytes | None) -> Any:
    try:
        return wire.decode(value)
    except wire.DecodeError as exc:
        return exc


def _same(bulk: Any, single: Any) -> bool:
    if isinstance(single, wire.DecodeError):
        return isinstance(bulk, wire.DecodeError) and (bulk.reason, bulk.detail, bulk.raw) == (
            single.reason,
            single.detail,
            single.raw,
        )
    return type(bulk) is type(single) and bulk == single


def assert_equivalent(values: list[bytes | None]) -> None:
    bulk = decode_values(values)
    assert len(bulk) == len(values)
    for index, value in enumerate(values):
        single = _outcome(value)
        assert _same(bulk[index], single), (index, value, bulk[index], single)


def _v1(chunk: CodecChunk) -> bytes:
    """`chunk` as a codec_chunk.v1 writer wrote it (an older writer: resolved, not walked)."""
    schema = json.loads(catalog.schema_json("codec_chunk", 1))
    fields = {f["name"] for f in schema["fields"]}
    values = {k: v for k, v in to_dict(chunk).items() if k in fields}
    body = io.BytesIO()
    schemaless_writer(body, parse_schema(schema), values)
    labels = {label: hex_fp for hex_fp, label in catalog.known_fingerprints().items()}
    fingerprint = bytes.fromhex(labels["codec_chunk.v1"])
    return wire.MARKER + fingerprint + body.getvalue()


encoded = st.one_of(codec_chunks, control_events, audio_chunks).map(wire.encode)


@st.composite
def damaged(draw: st.DrawFn) -> bytes | None:
    """A valid value, then possibly cut, extended, overwritten or replaced."""
    value = draw(encoded)
    how = draw(st.sampled_from(["keep", "cut", "extend", "flip", "bytes", "none", "old"]))
    if how == "cut":
        return value[: draw(st.integers(0, len(value)))]
    if how == "extend":
        return value + draw(st.binary(min_size=1, max_size=4))
    if how == "flip":
        at = draw(st.integers(0, len(value) - 1))
        return value[:at] + bytes([draw(st.integers(0, 255))]) + value[at + 1 :]
    if how == "bytes":
        return draw(st.binary(max_size=30))
    if how == "none":
        return None
    if how == "old":
        return _v1(draw(codec_chunks))
    return value


@settings(max_examples=300, deadline=None)
@given(st.lists(damaged(), max_size=25))
def test_bulk_decode_equals_decode_of_each_value(values: list[bytes | None]) -> None:
    assert_equivalent(values)


@settings(max_examples=200, deadline=None)
@given(st.lists(encoded, min_size=1, max_size=10), st.data())
def test_one_damaged_value_does_not_change_its_neighbours(
    values: list[bytes], data: st.DataObject
) -> None:
    at = data.draw(st.integers(0, len(values) - 1))
    values[at] = values[at][: data.draw(st.integers(0, len(values[at])))]
    assert_equivalent(list(values))


def _with_long_varint(value: bytes, field_offset: int) -> bytes:
    """The value with the one-byte varint at `field_offset` spelled in two bytes (valid Avro,
    not canonical): the bulk path must hand it to wire.decode."""
    byte = value[field_offset]
    assert byte < 0x80
    return value[:field_offset] + bytes([byte | 0x80, 0]) + value[field_offset + 1 :]


def test_non_canonical_varints_and_bad_booleans_are_decoded_like_wire_decode() -> None:
    chunk = wire.encode(CodecChunk("r1", (), cache_epoch=3, chunk_seq=4))
    body = wire.HEADER_BYTES + 1 + 2  # past request_id ("r1") : codes count
    long_varint = _with_long_varint(chunk, body)
    booleans = bytearray(chunk)
    booleans[body + 1 + 2 + 1 + 2] = 2  # last_chunk spelled 2
    assert_equivalent([chunk, long_varint, bytes(booleans)])


def test_invalid_utf8_and_out_of_range_ints_are_refused_like_wire_decode() -> None:
    chunk = wire.encode(CodecChunk("ab", (5,)))
    bad_text = chunk.replace(b"ab", b"\xff\xfe", 1)
    huge = wire.MARKER + catalog.fingerprint_of(CodecChunk) + b"\x00\x02" + b"\xff" * 9 + b"\x01"
    assert_equivalent([bad_text, huge, chunk])


def test_an_older_writer_is_resolved_like_wire_decode() -> None:
    old = _v1(CodecChunk("r1", (1, 2, 3), chunk_seq=5, producer_id="talker-old"))
    assert_equivalent([old, wire.encode(CodecChunk("r1", (1,)))])
    assert decode_values([old])[0] == CodecChunk(
        "r1", (1, 2, 3), chunk_seq=5, producer_id="talker-old"
    )


def test_realistic_stream_decodes_to_the_same_records() -> None:
    events = realistic_events(random.Random(5), sessions=20, turns=2)
    values: list[bytes | None] = [wire.encode(event) for event in events]
    assert decode_values(values) == [wire.decode(value) for value in values]
    assert all(type(r) in (CodecChunk, ControlEvent) for r in decode_values(values))


def test_records_are_genuine_instances_equal_to_init_built_ones() -> None:
    chunk = CodecChunk("r", (1, 2), code_flat_numel=2, ref_audio=b"x", streaming_condition_seq=7)
    control = ControlEvent("r", ControlKind.ABORT, "why")
    built = decode_values([wire.encode(chunk), wire.encode(control)])
    assert built == [chunk, control]
    assert type(built[0]) is CodecChunk and type(built[1]) is ControlEvent
    assert dataclasses.astuple(built[0]) == dataclasses.astuple(chunk)
    assert hash(built[0]) == hash(chunk)
