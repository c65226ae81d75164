"""Synthetic captures without a broker: events laid out as a topic would hold them.
How: docs/replay.md, "Synthetic captures"."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from codeclog.replay.capture_format import (
    CapturedRecord,
    CaptureFile,
    CaptureMetadata,
    PartitionSpan,
    TimestampType,
    fingerprint_of_value,
)
from codeclog.schemas.records import CodecChunk, ControlEvent


def partition_of(key: bytes, partitions: int) -> int:
    return zlib.crc32(key) % partitions


def records_from_events(
    events: Iterable[CodecChunk | ControlEvent],
    partitions: int = 8,
    topic: str = "codec.chunks",
    start_ms: int = 1_767_225_600_000,
    txn_records: int = 0,
) -> list[CapturedRecord]:
    """Wire-encode events into records in arrival order; 40 ms of record time per event."""
    from codeclog.schemas.wire import encode

    next_offset = [0] * partitions
    records = []
    for index, event in enumerate(events):
        key = event.request_id.encode()
        partition = partition_of(key, partitions)
        value = encode(event)
        records.append(
            CapturedRecord(
                topic=topic,
                partition=partition,
                offset=next_offset[partition],
                timestamp_ms=start_ms + 40 * index,
                timestamp_type=TimestampType.CREATE_TIME,
                key=key,
                value=value,
                schema_fingerprint=fingerprint_of_value(value),
                observed_at_ms=start_ms + 40 * index + 5,
            )
        )
        next_offset[partition] += 1
        if txn_records and records[-1].offset % (txn_records + 1) == txn_records - 1:
            next_offset[partition] += 1  # the commit marker's offset
    return records


def metadata_for(
    records: Sequence[CapturedRecord], partitions: int = 8, topic: str = "codec.chunks"
) -> CaptureMetadata:
    """A plausible header: spans cover the records, fixed ids and times (for stable files)."""
    ends = [0] * partitions
    for record in records:
        ends[record.partition] = max(ends[record.partition], record.offset + 1)
    return CaptureMetadata(
        topic=topic,
        partition_count=partitions,
        spans=tuple(PartitionSpan(p, 0, ends[p]) for p in range(partitions)),
        cluster_id="synthetic-cluster",
        created_at_ms=1_767_225_600_000,
        codeclog_version="synthetic",
        git_commit="unknown",
    )


def write_capture(
    path: str | Path,
    records: Sequence[CapturedRecord],
    metadata: CaptureMetadata,
    block_records: int = 1000,
) -> None:
    """Write records with a block every `block_records` (as a capture flushes per batch)."""
    with CaptureFile.create(path, metadata) as writer:
        for index, record in enumerate(records, start=1):
            writer.write(record)
            if index % block_records == 0:
                writer.flush()
