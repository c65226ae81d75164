"""The capture file (Avro OCF): round trip, header, torn last block, foreign files refused."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.replay.capture_blocks import CorruptBlockError
from codeclog.replay.capture_format import (
    CAPTURE_SCHEMA,
    CapturedRecord,
    CaptureFormatError,
    CaptureMetadata,
    CaptureReader,
    CaptureWriter,
    PartitionSpan,
    RecordHeader,
    TimestampType,
    fingerprint_of_value,
    is_capture_file,
    read_capture,
)
from codeclog.replay.synthetic import metadata_for, records_from_events, write_capture
from codeclog.schemas.catalog import known_fingerprints
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind
from codeclog.schemas.wire import encode

METADATA = CaptureMetadata(
    topic="codec.chunks",
    partition_count=8,
    spans=(PartitionSpan(0, 0, 120), PartitionSpan(3, 7, 9)),
    cluster_id="abc-cluster",
    created_at_ms=1_767_225_600_123,
    codeclog_version="0.1.0",
    git_commit="0123456789abcdef0123456789abcdef01234567",
    schema_fingerprints={"aa": "codec_chunk.v1"},
    request_filter=("r1", "r2"),
    client_versions={"librdkafka": "2.16.0"},
)


def _written(records: list[CapturedRecord], every: int = 3) -> bytes:
    buffer = io.BytesIO()
    writer = CaptureWriter(buffer, METADATA)
    for index, record in enumerate(records, start=1):
        writer.write(record)
        if index % every == 0:
            writer.flush()
    writer.flush()
    return buffer.getvalue()


def _read(data: bytes) -> tuple[CaptureReader, list[CapturedRecord]]:
    reader = CaptureReader(io.BytesIO(data))
    return reader, list(reader.records())


def _record(offset: int, value: bytes | None = b"v", key: bytes | None = b"r1") -> CapturedRecord:
    return CapturedRecord(
        topic="codec.chunks",
        partition=offset % 3,
        offset=offset,
        timestamp_ms=1_767_225_600_000 + offset,
        timestamp_type=TimestampType.CREATE_TIME,
        key=key,
        value=value,
        headers=(RecordHeader("trace", b"\x00\x01"), RecordHeader("empty", None)),
        schema_fingerprint=fingerprint_of_value(value),
        observed_at_ms=5,
        leader_epoch=offset % 2 or None,
    )


records_strategy = st.lists(
    st.builds(
        CapturedRecord,
        topic=st.text(min_size=1, max_size=20),
        partition=st.integers(0, 2**31 - 1),
        offset=st.integers(0, 2**63 - 1),
        timestamp_ms=st.integers(-(2**63), 2**63 - 1),
        timestamp_type=st.sampled_from(TimestampType),
        key=st.none() | st.binary(max_size=20),
        value=st.none() | st.binary(max_size=64),
        headers=st.lists(
            st.builds(RecordHeader, st.text(max_size=8), st.none() | st.binary(max_size=8)),
            max_size=3,
        ).map(tuple),
        schema_fingerprint=st.none() | st.binary(min_size=8, max_size=8),
        observed_at_ms=st.integers(0, 2**63 - 1),
        leader_epoch=st.none() | st.integers(0, 2**31 - 1),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(records=records_strategy, every=st.integers(1, 10))
def test_any_records_round_trip_exactly(records: list[CapturedRecord], every: int) -> None:
    reader, back = _read(_written(records, every))
    assert back == records
    assert reader.metadata == METADATA
    assert not reader.truncated


def test_synthetic_capture_round_trips_through_a_file(tmp_path: Path) -> None:
    events = [
        CodecChunk("r1", (4218, 4218, 4218, *range(25)), chunk_seq=0),
        ControlEvent("r2", ControlKind.ABORT, reason="client gone"),
        CodecChunk("r1", tuple(range(22, 50)), chunk_seq=1, last_chunk=True),
    ]
    records = records_from_events(events, partitions=2, txn_records=1)
    metadata = metadata_for(records, partitions=2)
    path = tmp_path / "c.ocf"
    write_capture(path, records, metadata)
    assert is_capture_file(path)
    meta, back, truncated = read_capture(path)
    assert (meta, back, truncated) == (metadata, records, False)
    assert all(r.schema_fingerprint == r.value[2:10] for r in back if r.value)
    assert {r.schema_fingerprint.hex() for r in back if r.schema_fingerprint} <= set(
        known_fingerprints()
    )
    assert [r.value for r in back] == [encode(e) for e in events]


def test_header_is_plain_avro_metadata_other_tools_can_read() -> None:
    data = _written([_record(1)])
    reader = fastavro.reader(io.BytesIO(data))
    assert reader.codec == "deflate"
    assert reader.metadata["capture.format_version"] == "1"
    assert reader.metadata["kafka.topic"] == "codec.chunks"
    assert reader.metadata["kafka.cluster_id"] == "abc-cluster"
    assert reader.metadata["kafka.isolation_level"] == "read_committed"
    assert reader.metadata["codeclog.git_commit"] == METADATA.git_commit
    assert reader.metadata["kafka.offsets"] == '{"0":{"end":120,"start":0},"3":{"end":9,"start":7}}'
    assert next(iter(reader))["timestamp_type"] == "CREATE_TIME"


def test_a_torn_last_block_leaves_every_earlier_block_readable() -> None:
    records = [_record(offset) for offset in range(12)]
    data = _written(records, every=4)
    outcomes = set()
    for cut in range(len(data) - 1, len(data) // 2, -1):
        try:
            reader, back = _read(data[:cut])
        except CaptureFormatError:
            continue
        assert back == records[: len(back)]
        assert len(back) % 4 == 0  # whole blocks only
        outcomes.add((len(back), reader.truncated))
    assert (8, True) in outcomes  # the last block torn: the first two blocks survive


def test_a_cut_inside_the_header_is_a_format_error() -> None:
    data = _written([_record(1)])
    with pytest.raises(CaptureFormatError):
        CaptureReader(io.BytesIO(data[:40]))


def test_an_avro_file_that_is_not_a_capture_is_refused() -> None:
    buffer = io.BytesIO()
    schema = {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "int"}]}
    fastavro.writer(buffer, schema, [{"x": 1}])
    with pytest.raises(CaptureFormatError, match="not a codeclog capture"):
        CaptureReader(io.BytesIO(buffer.getvalue()))


def test_an_unknown_format_version_is_refused() -> None:
    newer = dataclasses.replace(METADATA, format_version="99")
    buffer = io.BytesIO()
    CaptureWriter(buffer, newer).flush()
    with pytest.raises(CaptureFormatError, match="format version 99"):
        CaptureReader(io.BytesIO(buffer.getvalue()))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (b"", None),
        (b"\xc3\x01" + b"12345678", b"12345678"),
        (b"\xc3\x01" + b"1234567", None),  # too short to hold a fingerprint
        (b"\xc3\x02" + b"12345678", None),  # another marker: not single-object encoding
        (b'{"json": 1}', None),
    ],
)
def test_fingerprint_of_value(value: bytes | None, expected: bytes | None) -> None:
    assert fingerprint_of_value(value) == expected


def test_a_jsonl_file_is_not_a_capture(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"request_id": "a", "codes": [0]}\n')
    assert not is_capture_file(path)


# ----------------------------------------------------------------------------- issue 41
# A corrupt block anywhere but a torn end is an error naming it (or skipped on request); a
# header or schema that is not the capture's is refused in one sentence naming what is wrong.


def _blocks(data: bytes) -> list[tuple[int, int]]:
    """(offset, size) of every block of a capture's bytes."""
    return [(block.offset, block.size) for block in fastavro.block_reader(io.BytesIO(data))]


def _flipped(data: bytes, position: int) -> bytes:
    damaged = bytearray(data)
    damaged[position] ^= 0x20
    return bytes(damaged)


def test_a_flipped_byte_in_a_middle_block_is_an_error_naming_the_block() -> None:
    """It was read as "the last block torn": 101 of 2,943 records, exit 0."""
    records = [_record(offset) for offset in range(12)]
    data = _written(records, every=4)
    (_, _), (offset, size), _ = _blocks(data)
    for position in range(offset + 2, offset + size, 3):  # every few bytes of block 2
        with pytest.raises(CorruptBlockError) as error:
            _read(_flipped(data, position))
        assert (error.value.number, error.value.offset) == (2, offset)
        assert f"block #2 (at byte {offset}) is corrupt" in str(error.value)


def test_a_corrupt_block_can_be_skipped_and_is_counted() -> None:
    records = [_record(offset) for offset in range(12)]
    data = _written(records, every=4)
    (_, _), (offset, size), _ = _blocks(data)
    reader = CaptureReader(io.BytesIO(_flipped(data, offset + size // 2)), skip_corrupt=True)
    assert list(reader.records()) == records[:4] + records[8:]
    [skipped] = reader.skipped
    assert (skipped.number, skipped.offset, skipped.size) == (2, offset, size)
    assert not reader.truncated


def test_a_damaged_last_block_that_is_whole_is_corrupt_not_torn() -> None:
    """Torn means cut short: a last block that ends with its sync marker and does not read is
    damaged, and says so."""
    records = [_record(offset) for offset in range(12)]
    data = _written(records, every=4)
    *_, (offset, size) = _blocks(data)
    with pytest.raises(CorruptBlockError, match="block #3"):
        _read(_flipped(data, offset + size // 2))


def test_a_size_that_runs_past_the_next_block_is_corrupt_not_torn() -> None:
    records = [_record(offset) for offset in range(12)]
    data = _written(records, every=4)
    (_, _), (offset, _), _ = _blocks(data)
    count_length = 1  # 4 records: one varint byte; the size's varint follows it
    grown = data[: offset + count_length] + b"\xfe\xff\x7f" + data[offset + count_length + 2 :]
    with pytest.raises(CorruptBlockError, match="block #2"):
        _read(grown)


def _raw_capture(
    schema: dict[str, object], records: list[dict[str, object]], **meta: str
) -> io.BytesIO:
    """An Avro container with `schema`, `records` and the capture header, `meta` replacing
    header values."""
    header = {**METADATA.to_avro_metadata(), **meta}
    buffer = io.BytesIO()
    fastavro.writer(buffer, schema, records, codec="deflate", metadata=header)
    buffer.seek(0)
    return buffer


def _schema_without(*names: str, **types: object) -> dict[str, object]:
    fields = [
        {**field, "type": types.get(field["name"], field["type"])}
        for field in CAPTURE_SCHEMA["fields"]
        if field["name"] not in names
    ]
    return {**CAPTURE_SCHEMA, "fields": fields}


def test_a_capture_whose_records_lack_fields_is_refused_naming_them() -> None:
    """It was a KeyError traceback."""
    raw = {k: v for k, v in _record(1).to_avro().items() if k not in ("key", "headers")}
    with pytest.raises(CaptureFormatError, match=r"lack the field\(s\) key, headers"):
        CaptureReader(_raw_capture(_schema_without("key", "headers"), [raw]))


def test_a_capture_whose_partition_and_offset_are_strings_is_refused() -> None:
    """It was accepted: the report said "partition p0"."""
    raw = {**_record(1).to_avro(), "partition": "p0", "offset": "x"}
    schema = _schema_without(partition="string", offset="string")
    with pytest.raises(CaptureFormatError, match='partition is "string", not "int"'):
        CaptureReader(_raw_capture(schema, [raw]))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("capture.request_filter", "[1, 2]", "capture.request_filter is malformed: expected a str"),
        ("kafka.offsets", '{"0": {"start": 1e400, "end": 2}}', "expected an integer, got inf"),
        ("kafka.offsets", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("client.versions", '{"a":' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
        ("kafka.offsets", '{"p0": {"start": 0, "end": 1}}', "expected a partition number"),
        ("kafka.partition_count", '"8"', "kafka.partition_count is malformed"),
    ],
    ids=["filter_of_ints", "offset_1e400", "nested_offsets", "nested_versions",
         "partition_name", "count_as_text"],
)  # fmt: skip
def test_a_malformed_header_value_is_refused_naming_its_key(
    key: str, value: str, message: str
) -> None:
    """Each was a traceback (TypeError in the report, OverflowError, RecursionError)."""
    with pytest.raises(CaptureFormatError, match=re.escape(message)):
        CaptureReader(_raw_capture(CAPTURE_SCHEMA, [_record(1).to_avro()], **{key: value}))
