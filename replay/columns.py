"""A capture read as columns: its blocks read whole, the records walked with numpy.
Reasons: docs/replay.md, "State-only replay"."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, overload

import numpy as np

from codeclog.replay.capture_blocks import BlockReader, SkippedBlock
from codeclog.replay.capture_format import (
    CAPTURE_SCHEMA,
    CapturedRecord,
    CaptureMetadata,
    TimestampType,
    read_header,
)
from codeclog.schemas.avro_walk import (
    Bools,
    Bytes,
    Int64s,
    Walk,
    blobs,
    padded,
    plan_of,
    take,
    walk,
    with_nulls,
)
from codeclog.user_files import user_file_error

_PLAN = plan_of(CAPTURE_SCHEMA)
_TIMESTAMP_TYPES = tuple(
    TimestampType[symbol]
    for symbol in next(f for f in CAPTURE_SCHEMA["fields"] if f["name"] == "timestamp_type")[
        "type"
    ]["symbols"]
)


@dataclasses.dataclass(frozen=True)
class _Blocks:
    """The whole blocks of a capture, decompressed and concatenated."""

    metadata: CaptureMetadata
    data: bytes
    starts: list[int]  # where each block starts in `data`
    counts: list[int]  # records per block
    truncated: bool
    skipped: tuple[SkippedBlock, ...]


class CaptureTable(Sequence[CapturedRecord]):
    """The records of a capture in log order (partition, then offset), as columns.

    As a sequence it yields `CapturedRecord`s (built on first use, exactly as `read_capture`
    builds them), so code that wants records can take them; the replay reads the columns.
    """

    def __init__(self, blocks: _Blocks, walked: Walk, buffer: Bytes) -> None:
        self.metadata = blocks.metadata
        self.truncated = blocks.truncated
        self.skipped = blocks.skipped
        self.data = blocks.data
        self.buffer = buffer  # `data`, padded for the walker
        partition, offset = walked.columns["partition"].values, walked.columns["offset"].values
        order = np.argsort(offset, kind="stable")
        # stable both times: records with equal (partition, offset) keep their file order,
        # as sorted() in replay.inputs.log_order keeps them
        order = order[np.argsort(partition[order], kind="stable")]
        self.partitions: Int64s = partition[order]
        self._columns = {name: take(column, order) for name, column in walked.columns.items()}
        self._records: tuple[CapturedRecord, ...] | None = None

    def __len__(self) -> int:
        return len(self.partitions)

    @overload
    def __getitem__(self, index: int) -> CapturedRecord: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[CapturedRecord]: ...

    def __getitem__(self, index: int | slice) -> CapturedRecord | Sequence[CapturedRecord]:
        return self.records()[index]

    def __iter__(self) -> Iterator[CapturedRecord]:
        return iter(self.records())

    def keys(self, rows: slice | Int64s = slice(None)) -> list[bytes | None]:
        """Each record's key (None for a record without one), in log order; `rows`: only
        those records."""
        return blobs(take(self._columns["key"], rows), self.data)

    def value_spans(self) -> tuple[Int64s, Int64s, Bools]:
        """(start, end, present) of each record's value in `data`, in log order."""
        column = self._columns["value"]
        assert column.lengths is not None and column.present is not None
        return column.values, column.values + column.lengths, column.present

    def records(self) -> tuple[CapturedRecord, ...]:
        """Every record as `CapturedRecord`, in log order (built once)."""
        if self._records is None:
            self._records = self._build_records()
        return self._records

    def _build_records(self) -> tuple[CapturedRecord, ...]:
        values = {name: self._list(name) for name in self._columns}
        topics = [topic.decode() for topic in values["topic"]]
        kinds = [_TIMESTAMP_TYPES[index] for index in values["timestamp_type"]]
        return tuple(
            CapturedRecord(*fields)
            for fields in zip(
                topics,
                values["partition"],
                values["offset"],
                values["timestamp_ms"],
                kinds,
                values["key"],
                values["value"],
                [()] * len(self),  # read_table refuses captures with headers
                values["schema_fingerprint"],
                values["observed_at_ms"],
                values["leader_epoch"],
                strict=True,
            )
        )

    def _list(self, name: str) -> list[Any]:
        column = self._columns[name]
        if column.lengths is not None:
            return blobs(column, self.data)
        return with_nulls(column, column.values.tolist())


def read_table(source: str | Path | IO[bytes], skip_corrupt: bool = False) -> CaptureTable | None:
    """The capture at a path or in a file object (seekable, at its start) as a table, or None
    when it must be read record by record (see above). Raises CaptureFormatError as
    `CaptureReader` does."""
    if isinstance(source, str | Path):
        try:
            with open(source, "rb") as fo:
                return read_table(fo, skip_corrupt)
        except OSError as exc:
            raise user_file_error("read", "capture", source, exc) from exc
    assert _PLAN is not None
    blocks = _read_blocks(source, skip_corrupt)
    buffer = padded(blocks.data)
    walked = _find_records(blocks, buffer)
    return None if walked is None else CaptureTable(blocks, walked, buffer)


def _read_blocks(fo: IO[bytes], skip_corrupt: bool = False) -> _Blocks:
    """The header and every whole block, inflated (the records are walked later)."""
    header = read_header(fo)
    reader = BlockReader(fo, header.sync, header.codec, _as_is, skip_corrupt)
    parts: list[bytes] = []
    counts: list[int] = []
    for data, count in reader:
        parts.append(data)
        counts.append(count)
    starts = np.concatenate(([0], np.cumsum([len(p) for p in parts]))).tolist()
    return _Blocks(
        header.metadata,
        b"".join(parts),
        starts,
        counts,
        reader.truncated,
        tuple(reader.skipped),
    )


def _as_is(data: bytes, count: int) -> tuple[bytes, int]:
    return data, count


def _find_records(blocks: _Blocks, buffer: Bytes) -> Walk | None:
    """Walk every record of every block, in file order; None unless each block chains."""
    assert _PLAN is not None
    candidates = _candidates(blocks)
    if candidates is None:
        return None
    limits = np.array(blocks.starts, dtype=np.int64)[
        np.searchsorted(blocks.starts, candidates, side="right")
    ]
    ok = np.ones(len(candidates), dtype=bool)
    walked = walk(_PLAN, buffer, candidates, limits, ok, exact=False)
    chain = _chain(blocks, candidates, walked)
    if chain is None:
        return None
    block_starts = chain[np.isin(candidates[chain], blocks.starts[:-1])]
    if not _texts_valid(walked, blocks.data, block_starts):
        return None
    return Walk(walked.ok[chain], walked.ends[chain], _pick(walked, chain))


def _candidates(blocks: _Blocks) -> Int64s | None:
    """Every position where the first record's topic field (length varint + bytes) occurs,
    block starts included."""
    data = blocks.data
    if not data:
        return np.array(blocks.starts[:-1], dtype=np.int64)
    length = data[0] >> 1  # zigzag, one byte: topics up to 63 bytes (else: no table)
    if data[0] & 0x81 or len(data) < 1 + length:
        return None
    prefix = np.frombuffer(data[: 1 + length], dtype=np.uint8)
    haystack = np.frombuffer(data, dtype=np.uint8)
    positions = np.flatnonzero(haystack[: len(data) - length] == prefix[0])
    for offset in range(1, 1 + length):  # narrowed byte by byte: few survive the first ones
        positions = positions[haystack[positions + offset] == prefix[offset]]
    merged = np.union1d(positions.astype(np.int64), blocks.starts[:-1])
    return merged.astype(np.int64)


def _chain(blocks: _Blocks, candidates: Int64s, walked: Walk) -> Int64s | None:
    """Indexes (into candidates) of the records, block by block; None if a chain breaks.

    From each block's start, the record that starts where the previous one ended, `count`
    times; the last must end at the block's end. Only candidates the walk proved count."""
    count = len(candidates)
    if count == 0:
        return None if any(blocks.counts) else np.zeros(0, dtype=np.int64)
    slot = np.minimum(np.searchsorted(candidates, walked.ends), count - 1)
    follows = np.where((candidates[slot] == walked.ends) & walked.ok[slot], slot, -1).tolist()
    firsts = np.minimum(np.searchsorted(candidates, blocks.starts[:-1]), count - 1).tolist()
    starts, ok, ends = candidates.tolist(), walked.ok.tolist(), walked.ends.tolist()
    chain: list[int] = []
    for block, records in enumerate(blocks.counts):
        begin, end = blocks.starts[block], blocks.starts[block + 1]
        if records == 0:
            if begin != end:
                return None
            continue
        index = firsts[block]
        if starts[index] != begin or not ok[index]:
            return None
        chain.append(index)
        for _ in range(records - 1):
            index = follows[index]
            if index < 0:
                return None
            chain.append(index)
        if ends[index] != end:
            return None
    return np.array(chain, dtype=np.int64)


def _pick(walked: Walk, chain: Int64s) -> dict[str, Any]:
    return {name: take(column, chain) for name, column in walked.columns.items()}


def _texts_valid(walked: Walk, data: bytes, block_starts: Int64s) -> bool:
    """Every topic decodes as UTF-8 (fastavro's reader would fail the block otherwise). Only
    the records that start a block (`block_starts`, indexes into the candidates) are read: any
    other record was found by the first record's topic, so it has that topic."""
    column = take(walked.columns["topic"], block_starts)
    try:
        for topic in set(blobs(column, data)):
            topic.decode()
    except UnicodeDecodeError:
        return False
    return True
