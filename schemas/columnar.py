"""Bulk wire decode: many SOE values at once (numpy), exactly what `wire.decode` gives each one.
Reasons: docs/wire-format.md, "Bulk decoding"."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np

from codeclog.schemas import avro_walk, catalog, wire
from codeclog.schemas.avro_walk import Bools, Bytes, Column, FieldPlan, Int64s, Walk

Outcome: TypeAlias = "catalog.Record | wire.DecodeError"


# ---------------------------------------------------------------------------------------------
# values: SOE framing and records


@dataclasses.dataclass(frozen=True)
class _Target:
    """A latest schema version the walker reads."""

    version: catalog.SchemaVersion
    plan: tuple[FieldPlan, ...]
    symbols: dict[str, tuple[str, ...]]  # enum field -> its symbols, by index


@functools.cache
def targets() -> dict[bytes, _Target]:
    targets = {}
    for version in catalog.registry().latest.values():
        plan = avro_walk.plan_of(version.parsed)
        if plan is not None:
            symbols = {
                f["name"]: tuple(f["type"]["symbols"])
                for f in version.parsed["fields"]
                if isinstance(f["type"], dict) and f["type"].get("type") == "enum"
            }
            targets[version.fingerprint] = _Target(version, plan, symbols)
    return targets


def decode_values(values: Sequence[bytes | None]) -> list[Outcome]:
    """`wire.decode` of every value, in order: each a record or the DecodeError it raises."""
    lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int64, len(values))
    ends = np.cumsum(lengths)
    data = b"".join(v for v in values if v)
    present = np.fromiter((v is not None for v in values), bool, len(values))
    return decode_spans(data, avro_walk.padded(data), ends - lengths, ends, present)


def decode_spans(
    data: bytes, buffer: Bytes, starts: Int64s, ends: Int64s, present: Bools
) -> list[Outcome]:
    """Decode the values data[starts[i]:ends[i]] (None where not `present`). `buffer` is
    `padded(data)`. Equal to `wire.decode` of each value, errors included."""
    results: list[Any] = [None] * len(starts)
    for fingerprint, rows in _by_target(buffer, starts, ends, present).items():
        target = targets()[fingerprint]
        ok = np.ones(len(rows), dtype=bool)
        body_starts = starts[rows] + wire.HEADER_BYTES
        walked = avro_walk.walk(target.plan, buffer, body_starts, ends[rows], ok)
        for row, result in zip(rows.tolist(), _records(target, walked, buffer, data), strict=True):
            results[row] = result
    for row in [i for i, result in enumerate(results) if result is None]:
        results[row] = _decode_one(data[starts[row] : ends[row]] if present[row] else None)
    return results


def _decode_one(value: bytes | None) -> Outcome:
    try:
        return wire.decode(value)
    except wire.DecodeError as exc:
        return exc


def _by_target(buffer: Bytes, starts: Int64s, ends: Int64s, present: Bools) -> dict[bytes, Int64s]:
    """Rows framed as SOE with the fingerprint of a walkable latest schema, by fingerprint."""
    framed = present & (ends - starts > wire.HEADER_BYTES)
    framed &= (buffer[starts] == wire.MARKER[0]) & (buffer[starts + 1] == wire.MARKER[1])
    rows = np.flatnonzero(framed)
    words = buffer[starts[rows, None] + np.arange(2, wire.HEADER_BYTES)]
    keys = np.ascontiguousarray(words).view(np.uint64).ravel()
    groups = {}
    for fingerprint in targets():
        selected = rows[keys == np.frombuffer(fingerprint, dtype=np.uint64)[0]]
        if len(selected):
            groups[fingerprint] = selected
    return groups


# ---------------------------------------------------------------------------------------------
# building records


def _texts(column: Column, buffer: Bytes, data: bytes, ok: Bools) -> list[Any]:
    """A string column as str (None where null). A row that is not valid UTF-8 is marked not
    ok: `wire.decode` then reports it. Equal strings are one object (request ids repeat
    every chunk): decoded once, and their hash is computed once for the fold's lookups."""
    rows, inverse = _distinct(column, buffer)
    values = avro_walk.blobs(avro_walk.take(column, rows), data)
    texts: list[Any] = []
    bad = []
    for index, blob in enumerate(values):
        try:
            texts.append(None if blob is None else blob.decode())
        except UnicodeDecodeError:
            bad.append(index)
            texts.append(None)
    if bad:
        ok[np.isin(inverse, bad)] = False
    return [texts[index] for index in inverse.tolist()]


_DISTINCT_WIDTH = 32  # longer strings are compared by the bytes objects themselves


def _distinct(column: Column, buffer: Bytes) -> tuple[Int64s, Int64s]:
    """(a row of each distinct value, each row's index into those rows) of a string column."""
    assert column.lengths is not None
    count = len(column.values)
    width = int(column.lengths.max()) if count else 0
    if width > _DISTINCT_WIDTH or count == 0:
        return np.arange(count, dtype=np.int64), np.arange(count, dtype=np.int64)
    spread = np.arange(width)
    matrix = np.zeros((count, width + 9), dtype=np.uint8)  # bytes, length, present
    # bytes past a row's length are zeroed below; the clip keeps the gather in the buffer
    matrix[:, :width] = buffer[np.minimum(column.values[:, None] + spread, len(buffer) - 1)]
    matrix[:, :width] *= spread < column.lengths[:, None]
    matrix[:, width : width + 8] = column.lengths.astype("<u8").view(np.uint8).reshape(count, 8)
    if column.present is not None:
        matrix[:, width + 8] = column.present
    keys = np.ascontiguousarray(matrix).view(np.dtype((np.void, width + 9))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return first.astype(np.int64), inverse.astype(np.int64).ravel()


def _arrays(column: Column) -> list[tuple[int, ...]]:
    assert column.items is not None
    flat = column.items.tolist()
    bounds = np.concatenate(([0], np.cumsum(column.values))).tolist()
    return [tuple(flat[a:b]) for a, b in itertools.pairwise(bounds)]


def _symbols(column: Column, symbols: tuple[str, ...]) -> list[Any]:
    # rows with an index out of range are not ok already; any symbol will do for them
    indexes = np.clip(column.values, 0, len(symbols) - 1).tolist()
    return avro_walk.with_nulls(column, [symbols[index] for index in indexes])


def _values(
    target: _Target, field: FieldPlan, column: Column, buffer: Bytes, data: bytes, ok: Bools
) -> list[Any]:
    """The field for every row as fastavro gives it (array fields already as tuples)."""
    if field.kind == "string":
        return _texts(column, buffer, data, ok)
    if field.kind in ("bytes", "fixed"):
        return avro_walk.blobs(column, data)
    if field.kind == "boolean":
        return avro_walk.with_nulls(column, column.values.astype(bool).tolist())
    if field.kind == "array":
        return _arrays(column)
    if field.kind == "enum":
        return _symbols(column, target.symbols[field.name])
    if field.kind == "empty_array":
        return [[] for _ in range(len(column.values))]
    return avro_walk.with_nulls(column, column.values.tolist())


def _records(target: _Target, walked: Walk, buffer: Bytes, data: bytes) -> list[Outcome | None]:
    """Records of the rows the walk proved (None for the others), built as
    `RecordMapping.build` does: its conversions, then its `construct`."""
    ok = walked.ok.copy()
    columns = {
        field.name: _values(target, field, walked.columns[field.name], buffer, data, ok)
        for field in target.plan
    }
    mapping = catalog.registry().mappings[target.version.name]
    for name, convert in mapping.to_record:
        if convert is not tuple:  # arrays are tuples already
            columns[name] = _convert(convert, columns[name], ok)
    columns_in_order = (columns[name] for name in mapping.field_names)
    records: list[Any] = list(map(mapping.construct, *columns_in_order))
    for row in np.flatnonzero(~ok).tolist():
        records[row] = None
    return records


def _convert(convert: Callable[[Any], Any], values: list[Any], ok: Bools) -> list[Any]:
    out: list[Any] = []
    for row, value in enumerate(values):
        try:
            out.append(convert(value))
        except ValueError:  # e.g. an enum symbol the Python enum lacks: wire.decode decides
            ok[row] = False
            out.append(None)
    return out
