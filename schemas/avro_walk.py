"""The columnar Avro walker: many Avro bodies in one byte buffer, read field by field for all
rows at once, vectorised with numpy. Exactness: docs/wire-format.md, "Bulk decoding"."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

Int64s: TypeAlias = npt.NDArray[np.int64]
Bools: TypeAlias = npt.NDArray[np.bool_]
Bytes: TypeAlias = npt.NDArray[np.uint8]

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
# reading the columns back


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
