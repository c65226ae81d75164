"""payload_envelope.v1: the generic envelope of the vllm-omni connector, on the wire."""

from __future__ import annotations

import dataclasses
import io
import json

import avro.io
import avro.schema

from codeclog.schemas import catalog, wire
from codeclog.schemas.records import PayloadEntry, PayloadEnvelope, PayloadKind

# Written by payload_envelope.v1 when it was released and never regenerated.
V1_GOLDEN_ENVELOPE = bytes.fromhex(
    "c3012d2862b058f3a6ef047231023102320c72315f315f3408001000000000000000000206696473000c00000000"
    "02040100020a696e7431360202000002046f6b00020201000000000000000206736571000400000000000000022a"
    "636f6465635f6368756e6b2e6368756e6b5f73657100020880a0d5edee660c6f6d6e692d31"
)
V1_GOLDEN_DECODED = PayloadEnvelope(
    "r1",
    "1",
    "2",
    "r1_1_4",
    (
        PayloadEntry((), PayloadKind.DICT),
        PayloadEntry(
            ("ids",), PayloadKind.TENSOR, bytes_value=b"\x01\x00", dtype="int16", shape=(1,)
        ),
        PayloadEntry(("ok",), PayloadKind.BOOL, bool_value=True),
        PayloadEntry(("seq",), PayloadKind.INT, source="codec_chunk.chunk_seq"),
    ),
    4,
    1_767_225_600_000,
    "omni-1",
)


def _entry_schema() -> dict[str, object]:
    schema = json.loads(catalog.schema_json("payload_envelope", 1))
    entries = next(f for f in schema["fields"] if f["name"] == "entries")
    return entries["type"]["items"]  # type: ignore[no-any-return]


def test_golden_v1_envelope_decodes_and_encodes_to_the_same_bytes() -> None:
    assert catalog.known_fingerprints()[V1_GOLDEN_ENVELOPE[2:10].hex()] == "payload_envelope.v1"
    assert wire.decode(V1_GOLDEN_ENVELOPE) == V1_GOLDEN_DECODED
    assert wire.encode(V1_GOLDEN_DECODED) == V1_GOLDEN_ENVELOPE


def test_apache_avro_reads_an_envelope_body() -> None:
    version = catalog.registry().latest["payload_envelope"]
    reader = avro.io.DatumReader(avro.schema.parse(version.text))
    values = reader.read(avro.io.BinaryDecoder(io.BytesIO(V1_GOLDEN_ENVELOPE[10:])))
    assert isinstance(values, dict)
    assert [e["kind"] for e in values["entries"]] == ["dict", "tensor", "bool", "int"]
    assert values["entries"][1]["bytes_value"] == b"\x01\x00"


def test_entry_schema_matches_payload_entry_fields_defaults_and_kinds() -> None:
    schema = _entry_schema()
    fields = {f.name: f for f in dataclasses.fields(PayloadEntry)}
    assert [f["name"] for f in schema["fields"]] == list(fields)  # type: ignore[index]
    for field in schema["fields"]:  # type: ignore[attr-defined]
        default = fields[field["name"]].default
        if default is dataclasses.MISSING:
            assert "default" not in field
        else:
            assert field["default"] == (list(default) if isinstance(default, tuple) else default)
        assert field["doc"].strip()
    kind = next(f for f in schema["fields"] if f["name"] == "kind")  # type: ignore[attr-defined]
    assert kind["type"]["symbols"] == [k.value for k in PayloadKind]


def test_an_envelope_of_a_foreign_entry_is_refused_by_encode() -> None:
    bad = dataclasses.replace(V1_GOLDEN_DECODED, entries=("not an entry",))  # type: ignore[arg-type]
    try:
        wire.encode(bad)
    except wire.EncodeError as exc:
        assert exc.record_type == "PayloadEnvelope"
    else:
        raise AssertionError("encode accepted a foreign entry")
