"""Capture files of synthetic events, for the replay tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from codeclog.replay.capture_format import CapturedRecord
from codeclog.replay.synthetic import metadata_for, records_from_events, write_capture
from codeclog.schemas.records import CodecChunk, ControlEvent


def write_events(
    path: Path,
    events: Sequence[CodecChunk | ControlEvent],
    partitions: int,
    damaged: Mapping[int, bytes | None] | None = None,
    txn_records: int = 0,
    block_records: int = 1000,
) -> list[CapturedRecord]:
    """`events` as a capture at `path` on `partitions` (replay.synthetic's records: 40 ms apart,
    a transaction gap every `txn_records`); `damaged` replaces the values of the records at its
    indexes (bytes no decoder reads, or None). Returns the records written."""
    records = records_from_events(events, partitions=partitions, txn_records=txn_records)
    for index, value in (damaged or {}).items():
        records[index] = dataclasses.replace(records[index], value=value)
    write_capture(path, records, metadata_for(records, partitions=partitions), block_records)
    return records
