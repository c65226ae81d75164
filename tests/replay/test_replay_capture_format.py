"""The capture file (Avro OCF): round trip, header, torn last block, foreign files refused."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.replay.capture_format import (
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
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind
from codeclog.schemas.wire import encode, known_fingerprints

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
