"""Schema evolution: every version is BACKWARD and FORWARD compatible with every earlier one."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
from pathlib import Path
from typing import Any

import avro.schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from fastavro import parse_schema, schemaless_reader

from codeclog.schemas import catalog, wire
from codeclog.schemas.records import AudioChunk, to_dict
from codeclog.testing.upstream_streams import preroll_window

# Written by codec_chunk.v1 (fastavro 1.13, before v2 existed) and never regenerated: the
# write-old/read-new test must not depend on today's code to produce "old" bytes.
V1_GOLDEN_CHUNK = bytes.fromhex(
    "c3019a6d29d005c158c70472310ef441f441f441c801ca01cc01ce01000204020e08060101010a120c68c3a9"
    "6c6c6f000000021848545f7265665f617564696ff681e682b9661474616c6b65722d6f6c64"
)
V1_GOLDEN_DECODED = preroll_window(
    "r1",
    (100, 101, 102, 103),
    cache_epoch=1,
    chunk_seq=2,
    last_chunk=True,
    tts_is_last_chunk=True,
    turn_end=True,
    duplex_epoch=5,
    duplex_turn_id=9,
    llm_output_text_utf8="héllo".encode(),
    prompt_cache_id="HT_ref_audio",
    produced_at_ms=1_760_000_000_123,
    producer_id="talker-old",
    streaming_condition_seq=None,  # not in v1: the v2 default
)


def _pairs() -> list[tuple[str, int, int]]:
    """(name, older, newer) for every two versions of a record type (transitive)."""
    pairs = []
    for name in catalog.RECORD_TYPES:
        versions = range(1, catalog.latest_version(name) + 1)
        pairs += [(name, old, new) for old, new in itertools.combinations(versions, 2)]
    return pairs


def _avro(name: str, version: int) -> avro.schema.Schema:
    return avro.schema.parse(catalog.schema_json(name, version))


def _compatible(reader: avro.schema.Schema, writer: avro.schema.Schema) -> bool:
    result = ReaderWriterCompatibilityChecker().get_compatibility(reader, writer)
    return bool(result.compatibility is SchemaCompatibilityType.compatible)


def test_there_is_an_evolution_to_check() -> None:
    assert ("codec_chunk", 1, 2) in _pairs()


@pytest.mark.parametrize(("name", "old", "new"), _pairs())
def test_new_reads_old_backward(name: str, old: int, new: int) -> None:
    assert _compatible(reader=_avro(name, new), writer=_avro(name, old))


@pytest.mark.parametrize(("name", "old", "new"), _pairs())
def test_old_reads_new_forward(name: str, old: int, new: int) -> None:
    assert _compatible(reader=_avro(name, old), writer=_avro(name, new))


def _with_field(name: str, field: dict[str, Any]) -> avro.schema.Schema:
    schema = json.loads(catalog.schema_json(name, catalog.latest_version(name)))
    schema["fields"].append(field)
    return avro.schema.parse(json.dumps(schema))


def test_checker_catches_a_required_field_without_default() -> None:
    """Control: the compatibility checks above can fail."""
    latest = _avro("codec_chunk", catalog.latest_version("codec_chunk"))
    bad = _with_field("codec_chunk", {"name": "speaker", "type": "string"})
    assert not _compatible(reader=bad, writer=latest)  # new consumer cannot read old data
    assert _compatible(reader=latest, writer=bad)  # an added field is still forward-safe


def test_checker_catches_an_enum_symbol_added_without_default() -> None:
    schema = json.loads(catalog.schema_json("control_event", 1))
    schema["fields"][1]["type"]["symbols"].append("pause")
    newer = avro.schema.parse(json.dumps(schema))
    assert _compatible(reader=newer, writer=_avro("control_event", 1))
    assert not _compatible(reader=_avro("control_event", 1), writer=newer)


def test_golden_v1_chunk_decodes_into_latest() -> None:
    assert catalog.known_fingerprints()[V1_GOLDEN_CHUNK[2:10].hex()] == "codec_chunk.v1"
    assert wire.decode(V1_GOLDEN_CHUNK) == V1_GOLDEN_DECODED


def test_latest_chunk_reads_with_the_v1_reader_schema() -> None:
    """Write-new/read-old: a consumer still on v1 reads v2 records and drops the new field."""
    chunk = dataclasses.replace(V1_GOLDEN_DECODED, streaming_condition_seq=77)
    assert _read_with_v1("codec_chunk", chunk) == _fields_but(chunk, {"streaming_condition_seq"})


def _read_with_v1(name: str, record: Any) -> Any:
    """`record` written with its latest schema, read with the v1 reader schema of `name`."""
    v1 = parse_schema(json.loads(catalog.schema_json(name, 1)))
    data = wire.encode(record)
    return schemaless_reader(io.BytesIO(data[10:]), catalog.registry().latest[name].parsed, v1)


def _fields_but(record: Any, dropped: set[str]) -> dict[str, Any]:
    return {key: value for key, value in to_dict(record).items() if key not in dropped}


def _default(avro_field: dict[str, Any], record_default: Any) -> Any:
    value = avro_field["default"]
    # Avro JSON writes a bytes default as a string of code points 0-255.
    return value.encode("latin-1") if isinstance(record_default, bytes) else value


@pytest.mark.parametrize(
    ("name", "version"), [(v.name, v.version) for v in catalog.registry().versions]
)
def test_avro_defaults_equal_record_defaults(name: str, version: int) -> None:
    schema = json.loads(catalog.schema_json(name, version))
    record_fields = {f.name: f for f in dataclasses.fields(catalog.RECORD_TYPES[name])}
    for field in schema["fields"]:
        record_field = record_fields[field["name"]]
        if record_field.default is dataclasses.MISSING:
            assert "default" not in field, field["name"]
        else:
            assert _default(field, record_field.default) == record_field.default, field["name"]


@pytest.mark.parametrize("name", catalog.RECORD_TYPES)
def test_latest_schema_has_exactly_the_record_fields_in_order(name: str) -> None:
    schema = json.loads(catalog.schema_json(name, catalog.latest_version(name)))
    names = [field["name"] for field in schema["fields"]]
    assert names == [f.name for f in dataclasses.fields(catalog.RECORD_TYPES[name])]


@pytest.mark.parametrize(
    ("name", "version"), [(v.name, v.version) for v in catalog.registry().versions]
)
def test_every_schema_and_field_is_documented(name: str, version: int) -> None:
    schema = json.loads(catalog.schema_json(name, version))
    assert schema["namespace"] == "codeclog"
    assert schema["doc"].strip()
    for field in schema["fields"]:
        assert field.get("doc", "").strip(), field["name"]


def test_nullable_fields_put_null_first_with_null_default() -> None:
    for version in catalog.registry().versions:
        for field in json.loads(version.text)["fields"]:
            if isinstance(field["type"], list):
                assert field["type"][0] == "null" and field["default"] is None, field["name"]


# The registry refuses a broken schema folder instead of guessing. Each case adds one file:
# new file name -> (copied from, text replaced, replacement), and names the expected complaint.
Extra = dict[str, tuple[str, str, str]]
BROKEN_FOLDERS: dict[str, tuple[Extra, str]] = {
    "misnamed_file": ({"codec_chunk.avsc": ("codec_chunk.v1.avsc", "", "")}, "unexpected schema"),
    "unknown_record": ({"speaker.v1.avsc": ("codec_chunk.v1.avsc", "", "")}, "unexpected schema"),
    "version_hole": ({"codec_chunk.v4.avsc": ("codec_chunk.v1.avsc", "", "")}, "must be 1..N"),
    "same_schema_twice": ({"codec_chunk.v3.avsc": ("codec_chunk.v2.avsc", "", "")}, "same canon"),
    "wrong_record_name": (
        {"control_event.v2.avsc": ("control_event.v1.avsc", '"ControlEvent"', '"Control"')},
        "must be named codeclog.ControlEvent",
    ),
    "field_not_in_record": (
        {"control_event.v2.avsc": ("control_event.v1.avsc", '"reason"', '"cause"')},
        r"differ in \['cause', 'reason'\]",
    ),
    "enum_symbols_differ": (
        {"control_event.v2.avsc": ("control_event.v1.avsc", '"finish"]', '"finish", "pause"]')},
        "symbols differ from ControlKind",
    ),
}


def _copy_schemas(target: Path, extra: Extra) -> None:
    for path in catalog.AVRO_DIR.glob("*.avsc"):
        (target / path.name).write_text(path.read_text())
    for new_name, (source, old, new) in extra.items():
        text = (catalog.AVRO_DIR / source).read_text()
        assert old in text
        (target / new_name).write_text(text.replace(old, new) if old else text)


@pytest.mark.parametrize("case", BROKEN_FOLDERS, ids=BROKEN_FOLDERS.keys())
def test_registry_refuses_a_broken_schema_folder(case: str, tmp_path: Path) -> None:
    extra, message = BROKEN_FOLDERS[case]
    _copy_schemas(tmp_path, extra)
    with pytest.raises(catalog.WireError, match=message):
        catalog.check_folder(tmp_path)


def test_registry_accepts_the_shipped_folder(tmp_path: Path) -> None:
    _copy_schemas(tmp_path, {})
    catalog.check_folder(tmp_path)


# Written by audio_chunk.v1 (fastavro, before v2 existed) and never regenerated.
V1_GOLDEN_AUDIO = bytes.fromhex(
    "c3011a2a607d09a0448604723104040002000680ee0580f702080100ff7f8001616261626162616261626162"
    "6162616261626162616261626162616261626162616261626162616261626162616261626162616261626162"
    "616261626162616200010100000000f681e682b96616766f636f6465722d6f6c64"
)


def test_golden_v1_audio_decodes_with_an_unknown_domain() -> None:
    """Audio written before the determinism domain existed reads as domain "" (unknown)."""
    assert catalog.known_fingerprints()[V1_GOLDEN_AUDIO[2:10].hex()] == "audio_chunk.v1"
    audio = wire.decode(V1_GOLDEN_AUDIO)
    assert isinstance(audio, AudioChunk)
    assert (audio.request_id, audio.window_index, audio.sample_offset) == ("r1", 3, 48000)
    assert audio.pcm_s16le == b"\x01\x00\xff\x7f"
    assert audio.producer_id == "vocoder-old"
    assert audio.determinism_domain == ""


def test_latest_audio_reads_with_the_v1_reader_schema() -> None:
    """Write-new/read-old: a v1 reader (e.g. an old verify) reads v2 audio, domain dropped."""
    audio = dataclasses.replace(
        wire.decode(V1_GOLDEN_AUDIO), determinism_domain="portable1:torch2.15:x86_64"
    )
    assert _read_with_v1("audio_chunk", audio) == _fields_but(audio, {"determinism_domain"})


# Written by dead_letter.v1 and stream_checkpoint.v1 (fastavro, before their v2 existed) and
# never regenerated: old dead letters and checkpoints on the topics stay readable.
V1_GOLDEN_DEAD_LETTER = bytes.fromhex(
    "c301d699bc2c63d848411c747261696c696e675f627974657318636f6465632e6368756e6b7304520ac3016162"
    "6302047231020472310000447b226465636f64655f726561736f6e223a22747261696c696e675f627974657322"
    "7d303320627974657320616674657220746865207265636f7264f681e682b96624636f6465636c6f672d766f63"
    "6f6465722d30"
)
V1_GOLDEN_CHECKPOINT = bytes.fromhex(
    "c301b84761925d27020d04723118636f6465632e6368756e6b730401023c520680e508047b7df681e682b96624"
    "636f6465636c6f672d766f636f6465722d30"
)


def test_golden_v1_dead_letter_decodes_into_latest_as_whole_and_untruncated() -> None:
    from codeclog.schemas.records import DeadLetter

    assert catalog.known_fingerprints()[V1_GOLDEN_DEAD_LETTER[2:10].hex()] == "dead_letter.v1"
    letter = wire.decode(V1_GOLDEN_DEAD_LETTER)
    assert letter == DeadLetter(
        reason="trailing_bytes",
        source_topic="codec.chunks",
        source_partition=2,
        source_offset=41,
        raw_value=b"\xc3\x01abc",
        raw_key=b"r1",
        request_id="r1",
        details_json='{"decode_reason":"trailing_bytes"}',
        error="3 bytes after the record",
        dead_lettered_at_ms=1_760_000_000_123,
        producer_id="codeclog-vocoder-0",
        raw_value_truncated=False,  # the v2 defaults: v1 always carried the whole value
        raw_value_size=-1,
        raw_value_sha256="",
    )


def test_golden_v1_checkpoint_decodes_into_latest_without_a_group() -> None:
    from codeclog.schemas.records import StreamCheckpoint

    assert catalog.known_fingerprints()[V1_GOLDEN_CHECKPOINT[2:10].hex()] == "stream_checkpoint.v1"
    checkpoint = wire.decode(V1_GOLDEN_CHECKPOINT)
    assert checkpoint == StreamCheckpoint(
        "r1",
        "codec.chunks",
        2,
        True,
        1,
        30,
        41,
        3,
        72000,
        "{}",
        1_760_000_000_123,
        "codeclog-vocoder-0",
        consumer_group="",
        determinism_domain="",
    )


@pytest.mark.parametrize(
    ("name", "dropped"),
    [
        ("dead_letter", {"raw_value_truncated", "raw_value_size", "raw_value_sha256"}),
        ("stream_checkpoint", {"consumer_group", "determinism_domain"}),
    ],
)
def test_v2_reads_with_the_v1_reader_schema(name: str, dropped: set[str]) -> None:
    """Write-new/read-old: a consumer still on v1 reads v2 dead letters and checkpoints."""
    golden = V1_GOLDEN_DEAD_LETTER if name == "dead_letter" else V1_GOLDEN_CHECKPOINT
    record = wire.decode(golden)
    extra = (
        {"consumer_group": "g", "determinism_domain": "portable1:torch2.15:x86_64"}
        if name == "stream_checkpoint"
        else {"raw_value_truncated": True, "raw_value_size": 9, "raw_value_sha256": "ab"}
    )
    newer = dataclasses.replace(record, **extra)  # type: ignore[arg-type]
    assert _read_with_v1(name, newer) == _fields_but(newer, dropped)
