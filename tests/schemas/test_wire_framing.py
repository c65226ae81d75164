"""Single-object-encoding framing and fingerprints, checked against the Avro spec."""

from __future__ import annotations

import io
import json
from pathlib import Path

import avro.io
import avro.schema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from codeclog.errors import CodeclogError
from codeclog.schemas import catalog, wire
from codeclog.schemas.records import (
    AudioChunk,
    CodecChunk,
    ControlEvent,
    ControlKind,
    DeadLetter,
    PayloadEntry,
    PayloadEnvelope,
    PayloadKind,
    StreamCheckpoint,
)
from tests.schemas.refusal import assert_refused

DOC = Path(__file__).resolve().parents[2] / "docs" / "wire-format.md"

# Released schemas are immutable: a changed fingerprint here means someone edited a released
# .avsc file. Add <name>.v<N+1>.avsc instead (docs/wire-format.md, "Evolution").
RELEASED = {
    "1a2a607d09a04486": "audio_chunk.v1",
    "a302131fe8753153": "audio_chunk.v2",
    "9a6d29d005c158c7": "codec_chunk.v1",
    "2c1f915c3a872f97": "codec_chunk.v2",
    "1bbfab44b732974c": "control_event.v1",
    "d699bc2c63d84841": "dead_letter.v1",
    "03e98d1a172905bc": "dead_letter.v2",
    "834191cc2a56776d": "handout_mark.v1",
    "de61d57fb920d962": "handout_move.v1",
    "2d2862b058f3a6ef": "payload_envelope.v1",
    "b84761925d27020d": "stream_checkpoint.v1",
    "3604587b7d5af268": "stream_checkpoint.v2",
}

EMPTY_RABIN = 0xC15D213AA4D7A795  # Avro spec: the fingerprint of the empty input


def _rabin_table() -> list[int]:
    table = []
    for byte in range(256):
        fp = byte
        for _ in range(8):
            fp = (fp >> 1) ^ (EMPTY_RABIN & -(fp & 1))
        table.append(fp)
    return table


_TABLE = _rabin_table()


def rabin_crc64(data: bytes) -> int:
    """CRC-64-AVRO as written in the Avro spec ("Schema Fingerprints"), independent of fastavro."""
    fp = EMPTY_RABIN
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp


def _labels() -> list[tuple[str, int]]:
    return [(v.name, v.version) for v in catalog.registry().versions]


def test_rabin_of_empty_input_is_the_spec_constant() -> None:
    assert rabin_crc64(b"") == EMPTY_RABIN


def test_rabin_matches_apache_avro_on_primitive_schemas() -> None:
    """Control for the hand-written Rabin: it agrees with apache avro on schemas we do not own."""
    for primitive in ("null", "int", "string", "bytes"):
        expected = avro.schema.parse(json.dumps(primitive)).fingerprint("CRC-64-AVRO")
        assert rabin_crc64(f'"{primitive}"'.encode()).to_bytes(8, "little") == expected


@pytest.mark.parametrize(("name", "version"), _labels())
def test_fingerprint_is_rabin_of_canonical_form_and_matches_apache_avro(
    name: str, version: int
) -> None:
    schema = avro.schema.parse(catalog.schema_json(name, version))
    ours = next(v for v in catalog.registry().versions if v.label == f"{name}.v{version}")
    assert catalog.canonical_form(name, version) == schema.canonical_form
    assert ours.fingerprint == schema.fingerprint("CRC-64-AVRO")
    assert ours.fingerprint == rabin_crc64(ours.canonical_form.encode()).to_bytes(8, "little")


def test_released_fingerprints_are_pinned() -> None:
    assert catalog.known_fingerprints() == RELEASED


def test_no_schema_uses_logical_types() -> None:
    # Implementations disagree on the canonical form of logical types (apache avro Python 1.12
    # writes {"type":"long"}, fastavro and Java "long"; goavro #174; AVRO-4004), which would
    # make our fingerprints unportable. Units live in field names (`_ms`) and docs instead.
    for name, version in _labels():
        assert "logicalType" not in catalog.schema_json(name, version)


@pytest.mark.parametrize(
    "record",
    [
        CodecChunk("r", (1,)),
        ControlEvent("r", ControlKind.FINISH),
        AudioChunk("r", 0, (), 0, 0, 24000, b"", "", False),
        DeadLetter("x", "t", 0, 0, b""),
        StreamCheckpoint("r", "codec.chunks", 0, True, 0, 0, 0, 0, 0),
        PayloadEnvelope("r", "1", "2", "r_1_0", (PayloadEntry((), PayloadKind.DICT),)),
    ],
    ids=lambda record: type(record).__name__,
)
def test_frame_is_marker_fingerprint_body(record: catalog.Record) -> None:
    data = wire.encode(record)
    version = catalog.registry().latest_by_type[type(record)]
    assert data[0] == 0xC3 and data[1] == 0x01
    assert data[2:10] == version.fingerprint == catalog.fingerprint_of(type(record))
    assert wire.wire_fingerprint(data) == version.fingerprint
    assert catalog.known_fingerprints()[data[2:10].hex()] == version.label


def test_apache_avro_reads_our_body() -> None:
    """A foreign implementation decodes the body we frame (interoperability, not just fastavro)."""
    chunk = CodecChunk("req", (4218, 4218, 4218, 5), code_flat_numel=4, duplex_epoch=2**40)
    data = wire.encode(chunk)
    version = catalog.registry().latest["codec_chunk"]
    reader = avro.io.DatumReader(avro.schema.parse(version.text))
    values = reader.read(avro.io.BinaryDecoder(io.BytesIO(data[10:])))
    assert isinstance(values, dict)
    assert values["codes"] == [4218, 4218, 4218, 5]
    assert values["duplex_epoch"] == 2**40
    assert values["streaming_condition_seq"] is None


CRAFTED = {
    "none": (None, "empty"),
    "zero_bytes": (b"", "empty"),
    "json": (b'{"request_id": "r"}', "not_single_object"),
    "confluent_framing": (b"\x00\x00\x00\x00\x01\x02r", "not_single_object"),
    "wrong_second_marker_byte": (b"\xc3\x02" + bytes(9), "not_single_object"),
    "lone_first_marker_byte": (b"\xc3", "truncated"),
    "marker_only": (b"\xc3\x01", "truncated"),
    "header_cut": (b"\xc3\x01\x9a\x6d\x29", "truncated"),
    "unknown_fingerprint": (b"\xc3\x01" + bytes(8) + b"\x02r", "unknown_fingerprint"),
    "known_fingerprint_no_body": (bytes.fromhex("c3012c1f915c3a872f97"), "truncated"),
}


@pytest.mark.parametrize("case", CRAFTED, ids=CRAFTED.keys())
def test_crafted_value_is_refused_with_its_reason(case: str) -> None:
    assert_refused(*CRAFTED[case])


def _a_record_or_only_decode_error(data: bytes) -> None:
    """`data` decodes into a record that encodes again, or raises DecodeError carrying it."""
    try:
        record = wire.decode(data)
    except wire.DecodeError as exc:
        assert exc.raw == data
        return
    wire.encode(record)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_give_a_record_or_only_decode_error(data: bytes) -> None:
    _a_record_or_only_decode_error(data)


@given(st.sampled_from(sorted(RELEASED)), st.binary(max_size=200))
def test_known_header_with_arbitrary_body_gives_a_record_or_only_decode_error(
    fingerprint_hex: str, body: bytes
) -> None:
    _a_record_or_only_decode_error(wire.MARKER + bytes.fromhex(fingerprint_hex) + body)


def test_decode_error_is_a_codeclog_error_with_one_sentence() -> None:
    with pytest.raises(CodeclogError) as caught:
        wire.decode(b"nope")
    assert isinstance(caught.value, wire.DecodeError)
    assert "\n" not in str(caught.value)
    assert str(caught.value) == (
        "cannot decode a 4-byte value (not_single_object): no C3 01 single-object marker"
    )


def test_doc_shows_the_current_fingerprint_table() -> None:
    assert catalog.fingerprint_table() in DOC.read_text(encoding="utf-8")


def test_fingerprint_table_lists_every_version_once() -> None:
    table = catalog.fingerprint_table().splitlines()
    assert len(table) == 2 + len(RELEASED)
    for fp, label in RELEASED.items():
        assert sum(fp in line and label in line for line in table) == 1
