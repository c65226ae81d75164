"""Bulk wire decode: many Avro bodies at once (numpy), exactly what `wire.decode` gives each one.

`wire.decode` costs tens of microseconds a value in fastavro's reader and the Python around it;
a replay of a large capture decodes every value. Here the values sit in one byte buffer and are
walked field by field for all rows at once, vectorised with numpy.

Exactness is the contract, so the walker accepts only what it can prove it reads exactly as
fastavro does: the canonical encoding (shortest varints, booleans 0/1, union branches 0/1,
arrays as one block and a 0 terminator, in-range enum indexes, strings that are valid UTF-8,
ints within int32) ending exactly at the value's end. Any other row, malformed or merely
unusual (an older writer schema, a multi-block array), goes through `wire.decode` itself, which
gives the record or the exact `DecodeError`. tests/schemas/test_wire_columnar.py checks the
equivalence with hypothesis on valid, mutated, truncated and extended values.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from codeclog.schemas import wire

Int64s: TypeAlias = npt.NDArray[np.int64]
Bools: TypeAlias = npt.NDArray[np.bool_]
Bytes: TypeAlias = npt.NDArray[np.uint8]
Outcome: TypeAlias = "wire.Record | wire.DecodeError"

PADDING = 16  # zero bytes after the data, so a varint read near the end stays in the buffer
_INT32 = (-(2**31), 2**31 - 1)


@dataclasses.dataclass(frozen=True)
class FieldPlan:
    """How to walk one field. kind: int, long, boolean, string, bytes, enum, fixed, array
    (of int/long, `item` says which) or empty_array (any items: only an empty one is read)."""

    name: str
    kind: str
    nullable: bool = False  # the ["null", T] union
    size: int = 0  # fixed: bytes; enum: number of symbols
    item: str = ""  # array: "int" or "long"


@dataclasses.dataclass
class Column:
    """One decoded field for every row: ints in `values`; string/bytes/fixed as spans
    (`values` = start in the buffer, `lengths`); arrays as counts + flat row-major `items`."""

    values: Int64s
    present: Bools | None = None  # nullable fields: False where the value is null
    lengths: Int64s | None = None
    items: Int64s | None = None


@dataclasses.dataclass
class Walk:
    """The result of walking rows: `ok[i]` when row i is canonical and ends where it should."""

    ok: Bools
    ends: Int64s  # where each row's walk ended
    columns: dict[str, Column]


def plan_of(schema: Any) -> tuple[FieldPlan, ...] | None:
    """The walk plan of a flat record schema (parsed or JSON), or None if it has a field the
    walker does not read (nested records, maps, other unions)."""
    plans = []
    for field in schema["fields"]:
        plan = _field_plan(field["name"], field["type"])
        if plan is None:
            return None
        plans.append(plan)
    return tuple(plans)


def _field_plan(name: str, avro_type: Any) -> FieldPlan | None:
    if isinstance(avro_type, list):
        if len(avro_type) != 2 or avro_type[0] != "null":
            return None
        inner = _field_plan(name, avro_type[1])
        if inner is None or inner.nullable or inner.kind in ("array", "empty_array"):
            return None
        return dataclasses.replace(inner, nullable=True)
    if isinstance(avro_type, str):
        known = ("int", "long", "boolean", "string", "bytes")
        return FieldPlan(name, avro_type) if avro_type in known else None
    kind = avro_type.get("type") if isinstance(avro_type, dict) else None
    if kind == "enum":
        return FieldPlan(name, "enum", size=len(avro_type["symbols"]))
    if kind == "fixed":
        return FieldPlan(name, "fixed", size=int(avro_type["size"]))
    if kind == "array":
        items = avro_type["items"]
        if items in ("int", "long"):
            return FieldPlan(name, "array", item=items)
        return FieldPlan(name, "empty_array")
    return None


# ---------------------------------------------------------------------------------------------
# the walker


def padded(data: bytes) -> Bytes:
    """`data` as a uint8 array with PADDING zero bytes after it (what `walk` reads)."""
    buffer = np.zeros(len(data) + PADDING, dtype=np.uint8)
    buffer[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    return buffer


def walk(
    plan: Sequence[FieldPlan],
    buffer: Bytes,
    starts: Int64s,
    ends: Int64s,
    ok: Bools,
    exact: bool = True,
) -> Walk:
    """Read every row [starts[i], ends[i]) of `buffer` with `plan`. With `exact`, a row must
    end at its end; without, `ends` is only a limit and `Walk.ends` says where rows ended.
    Rows already not `ok` are walked too (harmlessly, inside the buffer) and stay not ok."""
    state = _Cursor(buffer, starts.astype(np.int64, copy=True), ends, ok.copy())
    columns = {field.name: _read_field(state, field) for field in plan}
    if exact:
        state.ok &= state.pos == ends
    return Walk(state.ok, state.pos, columns)


@dataclasses.dataclass
class _Cursor:
    buffer: Bytes
    pos: Int64s
    ends: Int64s
    ok: Bools

    def bound(self) -> None:
        """A row that read past its end is not ok; keep its position inside its bytes."""
        self.ok &= self.pos <= self.ends
        np.minimum(self.pos, self.ends, out=self.pos)


def _varint(cur: _Cursor, rows: Int64s | None = None) -> Int64s:
    """Zigzag varints (Avro int/long) at the cursor of `rows` (default: all), advancing it.
    Non-canonical (over-long), over-64-bit and unterminated varints make their row not ok."""
    pos = cur.pos if rows is None else cur.pos[rows]
    value, size, bad = _varints_at(cur.buffer, pos)
    if rows is None:
        cur.pos += size
        cur.ok &= ~bad
    else:
        cur.pos[rows] += size
        cur.ok[rows[bad]] = False
    cur.bound()
    return value


def _varints_at(buffer: Bytes, pos: Int64s) -> tuple[Int64s, Int64s, Bools]:
    """(value, size in bytes, bad) of the zigzag varint at each of `pos`."""
    short = _short_varints_at(buffer, pos)
    if short is not None:
        return short
    byte = buffer[pos]
    raw = (byte & 0x7F).astype(np.uint64)
    size = np.ones(len(pos), dtype=np.int64)
    more = np.flatnonzero(byte & 0x80)
    bad = np.zeros(len(pos), dtype=bool)
    shift = 7
    while len(more):
        if shift > 63:  # an 11th byte: fastavro would read on; not canonical anyway
            bad[more] = True
            break
        byte = buffer[pos[more] + size[more]]
        part = (byte & 0x7F).astype(np.uint64)
        if shift == 63:
            bad[more[part > 1]] = True  # more than 64 bits
        bad[more[byte == 0]] = True  # a trailing zero group: an over-long encoding
        raw[more] |= part << np.uint64(shift)
        size[more] += 1
        more = more[(byte & 0x80) != 0]
        shift += 7
    value = (raw >> np.uint64(1)).astype(np.int64) ^ -((raw & np.uint64(1)).astype(np.int64))
    return value, size, bad


def _short_varints_at(buffer: Bytes, pos: Int64s) -> tuple[Int64s, Int64s, Bools] | None:
    """`_varints_at` when every varint has one or two bytes (codec ids, sizes, small ints:
    nearly all of them), without per-byte index lists; None when one is longer."""
    first = buffer[pos].astype(np.int64)
    second = buffer[pos + 1].astype(np.int64)  # inside the buffer: PADDING follows the data
    two = first >> 7
    if np.any(two & (second >> 7)):
        return None
    raw = (first & 0x7F) | ((second & 0x7F) << 7) * two
    bad = (two == 1) & (second == 0)  # a trailing zero group: an over-long encoding
    return (raw >> 1) ^ -(raw & 1), 1 + two, bad


def _read_field(cur: _Cursor, field: FieldPlan) -> Column:
    if not field.nullable:
        return _read_value(cur, field, None)
    branch = _varint(cur)
    cur.ok &= (branch == 0) | (branch == 1)
    present = branch == 1
    rows = np.flatnonzero(present)
    column = _read_value(cur, field, rows)
    column.present = present
    return column


def _read_value(cur: _Cursor, field: FieldPlan, rows: Int64s | None) -> Column:
    """One value for `rows` (None: all rows); the column is full-length, zero where absent."""
    count = len(cur.pos)
    full = np.zeros(count, dtype=np.int64)
    kind = field.kind
    if kind in ("int", "long", "enum"):
        values = _varint(cur, rows)
        _set(full, rows, values)
        if kind == "int":
            _check(cur, rows, (values >= _INT32[0]) & (values <= _INT32[1]))
        elif kind == "enum":
            _check(cur, rows, (values >= 0) & (values < field.size))
        return Column(full)
    if kind == "boolean":
        return Column(_set(full, rows, _byte_flag(cur, rows)))
    if kind in ("string", "bytes", "fixed"):
        lengths = np.zeros(count, dtype=np.int64)
        starts, sizes = _span(cur, rows, field)
        return Column(_set(full, rows, starts), lengths=_set(lengths, rows, sizes))
    if kind == "array":
        return _read_array(cur, field)
    _read_empty_array(cur)
    return Column(full)


def _set(full: Int64s, rows: Int64s | None, values: Int64s) -> Int64s:
    if rows is None:
        full[:] = values
    else:
        full[rows] = values
    return full


def _check(cur: _Cursor, rows: Int64s | None, good: Bools) -> None:
    if rows is None:
        cur.ok &= good
    else:
        cur.ok[rows[~good]] = False


def _byte_flag(cur: _Cursor, rows: Int64s | None) -> Int64s:
    pos = cur.pos if rows is None else cur.pos[rows]
    byte = cur.buffer[pos].astype(np.int64)
    _check(cur, rows, byte <= 1)
    if rows is None:
        cur.pos += 1
    else:
        cur.pos[rows] += 1
    cur.bound()
    return byte


def _span(cur: _Cursor, rows: Int64s | None, field: FieldPlan) -> tuple[Int64s, Int64s]:
    """(start, length) of a string/bytes/fixed value, advancing past it."""
    if field.kind == "fixed":
        sizes = np.full(len(cur.pos) if rows is None else len(rows), field.size, dtype=np.int64)
    else:
        sizes = _varint(cur, rows)
    pos = cur.pos if rows is None else cur.pos[rows]
    room = cur.ends if rows is None else cur.ends[rows]
    fits = (sizes >= 0) & (sizes <= room - pos)
    _check(cur, rows, fits)
    sizes = np.where(fits, sizes, 0)
    starts = pos.copy()
    if rows is None:
        cur.pos += sizes
    else:
        cur.pos[rows] += sizes
    return starts, sizes


def _read_array(cur: _Cursor, field: FieldPlan) -> Column:
    """One block of items and the 0 terminator (what every Avro writer we know writes)."""
    counts = _varint(cur)
    room = cur.ends - cur.pos
    fits = (counts >= 0) & (counts <= room)  # every item is at least one byte
    cur.ok &= fits
    counts = np.where(fits, counts, 0)
    items = _read_items(cur, counts)
    if field.item == "int":
        owners = np.repeat(np.arange(len(counts)), counts)
        cur.ok[owners[(items < _INT32[0]) | (items > _INT32[1])]] = False
    with_items = np.flatnonzero(counts > 0)
    cur.ok[with_items[_varint(cur, with_items) != 0]] = False  # a second block: not ours
    return Column(counts, items=items)


def _read_items(cur: _Cursor, counts: Int64s) -> Int64s:
    """`counts[i]` varints at row i's cursor, for every row, flat in row order. The k-th items
    of all rows that have one are read at once; rows sorted by count, longest first, make
    those rows a prefix, and the cursors and values live in that order until the end."""
    order = np.argsort(-counts, kind="stable")
    ranked = counts[order]
    pos, ends = cur.pos[order], cur.ends[order]
    bad = np.zeros(len(order), dtype=bool)
    width = int(ranked[0]) if len(ranked) else 0
    # how many rows have more than k items, for k = 0 .. width-1
    having = np.searchsorted(-ranked, -np.arange(width), side="left")
    values = np.zeros((width, len(order)), dtype=np.int64)
    for index, rows in enumerate(having.tolist()):
        value, size, wrong = _varints_at(cur.buffer, pos[:rows])
        values[index, :rows] = value
        pos[:rows] += size
        bad[:rows] |= wrong | (pos[:rows] > ends[:rows])
        np.minimum(pos[:rows], ends[:rows], out=pos[:rows])  # stay inside the row's bytes
    cur.pos[order] = pos
    cur.ok[order[bad]] = False
    matrix = np.empty((len(order), width), dtype=np.int64)
    matrix[order] = values.T
    return matrix[np.arange(width) < counts[:, None]]


def _read_empty_array(cur: _Cursor) -> None:
    cur.ok &= _varint(cur) == 0


# ---------------------------------------------------------------------------------------------
# values: SOE framing and records


@dataclasses.dataclass(frozen=True)
class _Target:
    """A latest schema version the walker reads."""

    version: wire.SchemaVersion
    plan: tuple[FieldPlan, ...]
    symbols: dict[str, tuple[str, ...]]  # enum field -> its symbols, by index


@functools.cache
def targets() -> dict[bytes, _Target]:
    targets = {}
    for version in wire.registry().latest.values():
        plan = plan_of(version.parsed)
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
    return decode_spans(data, padded(data), ends - lengths, ends, present)


def decode_spans(
    data: bytes, buffer: Bytes, starts: Int64s, ends: Int64s, present: Bools
) -> list[Outcome]:
    """Decode the values data[starts[i]:ends[i]] (None where not `present`). `buffer` is
    `padded(data)`. Equal to `wire.decode` of each value, errors included."""
    results: list[Any] = [None] * len(starts)
    for fingerprint, rows in _by_target(buffer, starts, ends, present).items():
        target = targets()[fingerprint]
        ok = np.ones(len(rows), dtype=bool)
        walked = walk(target.plan, buffer, starts[rows] + wire.HEADER_BYTES, ends[rows], ok)
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
    values = blobs(take(column, rows), data)
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


def take(column: Column, rows: Int64s | slice) -> Column:
    """The column's values at `rows` (an index array or a slice). Array items are not taken
    (they are flat, not per row): the result has none."""
    return Column(
        column.values[rows],
        None if column.present is None else column.present[rows],
        None if column.lengths is None else column.lengths[rows],
    )


def blobs(column: Column, data: bytes) -> list[Any]:
    """A bytes/string/fixed column as bytes (None where null); `data` is the walked bytes."""
    assert column.lengths is not None
    rows = np.flatnonzero(column.lengths)
    starts = column.values[rows]
    bounds = zip(starts.tolist(), (starts + column.lengths[rows]).tolist(), strict=True)
    if len(rows) == len(column.values):
        return with_nulls(column, [data[a:b] for a, b in bounds])
    values: list[Any] = [b""] * len(column.values)
    for row, (a, b) in zip(rows.tolist(), bounds, strict=True):
        values[row] = data[a:b]
    return with_nulls(column, values)


def with_nulls(column: Column, values: list[Any]) -> list[Any]:
    """`values` (one per row) with None where the nullable column is null."""
    if column.present is not None:
        for row in np.flatnonzero(~column.present).tolist():
            values[row] = None
    return values


def _arrays(column: Column) -> list[tuple[int, ...]]:
    assert column.items is not None
    flat = column.items.tolist()
    bounds = np.concatenate(([0], np.cumsum(column.values))).tolist()
    return [tuple(flat[a:b]) for a, b in itertools.pairwise(bounds)]


def _symbols(column: Column, symbols: tuple[str, ...]) -> list[Any]:
    # rows with an index out of range are not ok already; any symbol will do for them
    indexes = np.clip(column.values, 0, len(symbols) - 1).tolist()
    return with_nulls(column, [symbols[index] for index in indexes])


def _values(
    target: _Target, field: FieldPlan, column: Column, buffer: Bytes, data: bytes, ok: Bools
) -> list[Any]:
    """The field for every row as fastavro gives it (array fields already as tuples)."""
    if field.kind == "string":
        return _texts(column, buffer, data, ok)
    if field.kind in ("bytes", "fixed"):
        return blobs(column, data)
    if field.kind == "boolean":
        return with_nulls(column, column.values.astype(bool).tolist())
    if field.kind == "array":
        return _arrays(column)
    if field.kind == "enum":
        return _symbols(column, target.symbols[field.name])
    if field.kind == "empty_array":
        return [[] for _ in range(len(column.values))]
    return with_nulls(column, column.values.tolist())


def _records(target: _Target, walked: Walk, buffer: Bytes, data: bytes) -> list[Outcome | None]:
    """Records of the rows the walk proved (None for the others), built as
    `RecordMapping.build` does: its conversions, then its `construct`."""
    ok = walked.ok.copy()
    columns = {
        field.name: _values(target, field, walked.columns[field.name], buffer, data, ok)
        for field in target.plan
    }
    mapping = wire.registry().mappings[target.version.name]
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
