"""The plain lane of a tolerant state-only replay: requests reported straight from the columns.

Most requests of a real capture are plain: every chunk decodes canonically, carries its key,
valid ids and a sane position, and each epoch runs 0, 1, 2, ... after the previous one was
released. For such a request the tolerant fold can only take rules T5 (a fresh stream at seq 0),
T8 and A1, A2, A4, whose outcomes follow from a few integers per chunk (window frames, left
context, the two end flags). This module walks the chunk values once with numpy
(`codeclog.schemas.columnar.walk`, no records built) and reports plain requests from those integers.

Everything else is left to the fold: a request with any chunk the lane cannot prove (undecodable
or non-canonical bytes, a key mismatch, invalid ids or frame counts, a negative position, a gap,
a duplicate, a stale or reopened epoch, an empty non-final chunk, a control event, a request id
seen in two partitions) goes wholly to the fallback rows, which `replay.fast` decodes and folds
as before. Requests are isolated (docs/fold-contract.md: a stream's outcomes depend only on its
own events), so the two lanes' reports join into the fold's report, entries in the order of each
request's first event. The one state shared by requests, the LRU of released requests, cannot
evict anything when there are no more request ids than its bound; otherwise the lane is off.
tests/replay/test_replay_lanes.py checks the equivalence with hypothesis.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from codeclog.consumers.fold.machine import FoldConfig
from codeclog.schemas import columnar, wire
from codeclog.schemas.columnar import Bools, Bytes, Column, Int64s
from codeclog.schemas.records import MAX_CODEC_ID, CodecChunk, ControlEvent

Entry = dict[str, Any]  # a request's report entry: {"status": ..., "outcomes": [...]}


@dataclasses.dataclass(frozen=True)
class Lane:
    """What the plain lane reported, and the rows (indexes into the given spans) it left."""

    entries: dict[str, Entry]  # plain request id -> report entry
    first_rows: dict[str, int]  # plain request id -> its first row
    events: int  # rows reported (every row of a plain request)
    fallback: Int64s  # every other row, ascending
    decoded: dict[int, Any]  # fallback rows already decoded (a record or a DecodeError)


def plain_lane(
    data: bytes,
    buffer: Bytes,
    spans: tuple[Int64s, Int64s, Bools],
    keys: Column,
    partitions: Int64s,
    config: FoldConfig,
) -> Lane:
    """Report the plain requests of the values data[starts[i]:ends[i]] (`spans`: starts, ends,
    present; `buffer` is `padded(data)`), whose record keys are `keys` (spans in `buffer`),
    read from `partitions`."""
    starts, ends, present = spans
    count = len(starts)
    target = _chunk_target()
    if target is None:
        return _nothing(count)
    groups = columnar.by_target(buffer, starts, ends, present)
    rows = groups.get(target.version.fingerprint)
    if rows is None:
        return _nothing(count)
    ok = np.ones(len(rows), dtype=bool)
    walked = columnar.walk(target.plan, buffer, starts[rows] + wire.HEADER_BYTES, ends[rows], ok)
    ids, group = _request_groups(walked.columns["request_id"], buffer, data, walked.ok)
    known = np.zeros(count, dtype=bool)
    known[rows[walked.ok]] = True
    unknown = np.flatnonzero(~known)
    decoded = _decode_rows(data, buffer, spans, unknown)
    windows = _windows(walked.columns)
    plain = (
        walked.ok
        & _sound(walked.columns, windows)
        & _keyed(walked.columns["request_id"], columnar.take(keys, rows), buffer)
    )
    excluded = _excluded_groups(ids, group, plain, partitions[rows], decoded, config)
    entries, first_rows = _fold_plain(ids, group, rows, walked.columns, windows, excluded, config)
    in_lane = np.zeros(count, dtype=bool)
    lane_rows = np.isin(group, [index for index, rid in enumerate(ids) if rid in entries])
    in_lane[rows[lane_rows & walked.ok]] = True
    events = int(in_lane.sum())
    return Lane(entries, first_rows, events, np.flatnonzero(~in_lane), decoded)


def _nothing(count: int) -> Lane:
    return Lane({}, {}, 0, np.arange(count, dtype=np.int64), {})


@dataclasses.dataclass(frozen=True)
class _ChunkTarget:
    version: wire.SchemaVersion
    plan: tuple[columnar.FieldPlan, ...]


def _chunk_target() -> _ChunkTarget | None:
    """The latest CodecChunk schema, if the walker reads it and it has the fields used here."""
    version = wire.registry().latest_by_type.get(CodecChunk)
    target = columnar.targets().get(version.fingerprint) if version else None
    if version is None or target is None:
        return None
    names = {plan.name for plan in target.plan}
    if not names >= {"request_id", "codes", "cache_epoch", "chunk_seq", "code_flat_numel"} | {
        "codec_left_context_frames",
        "last_chunk",
        "tts_is_last_chunk",
    }:
        return None
    return _ChunkTarget(version, target.plan)


def _request_groups(
    column: Column, buffer: Bytes, data: bytes, ok: Bools
) -> tuple[list[str], Int64s]:
    """(distinct request ids, each walked row's index into them). A row whose id is not valid
    UTF-8 is marked not ok (its group is then meaningless)."""
    first, inverse = columnar.distinct(column, buffer)
    index_of: dict[str, int] = {}  # distinct id -> its group (insertion order = group order)
    to_group = np.zeros(len(first), dtype=np.int64)
    bad = []
    for position, blob in enumerate(columnar.blobs(columnar.take(column, first), data)):
        try:
            text = blob.decode()
        except UnicodeDecodeError:
            bad.append(position)
            text = ""
        to_group[position] = index_of.setdefault(text, len(index_of))
    if bad:
        ok[np.isin(inverse, bad)] = False
    return list(index_of), to_group[inverse]


def _windows(columns: dict[str, Column]) -> Int64s:
    """Each chunk's frame count: code_flat_numel, or len(codes) where it is null."""
    numel = columns["code_flat_numel"]
    assert numel.present is not None
    return np.where(numel.present, numel.values, columns["codes"].values)


def _sound(columns: dict[str, Column], window: Int64s) -> Bools:
    """Rows the tolerant fold's first checks (T1, T2, T2a) pass: a request id, positions >= 0,
    a frame count (`window`) within the codes and codec ids in range."""
    codes, rid = columns["codes"], columns["request_id"]
    assert codes.items is not None and rid.lengths is not None
    counts = codes.values
    good = (window >= 0) & (window <= counts)
    good &= rid.lengths > 0
    good &= (columns["cache_epoch"].values >= 0) & (columns["chunk_seq"].values >= 0)
    owner = np.repeat(np.arange(len(counts)), counts)
    place = np.arange(len(codes.items)) - np.repeat(np.cumsum(counts) - counts, counts)
    invalid = (codes.items < 0) | (codes.items > MAX_CODEC_ID)
    invalid &= place < window[owner]
    good[owner[invalid]] = False
    return good


def _keyed(request_ids: Column, keys: Column, buffer: Bytes) -> Bools:
    """Rows whose record key is the bytes of their request id (else the pipeline dead-letters
    them: key_mismatch, or missing_key when there is no key). Both are spans in `buffer`,
    compared 16 bytes at a time."""
    assert request_ids.lengths is not None and keys.lengths is not None
    present = np.ones(len(keys.values), dtype=bool) if keys.present is None else keys.present
    same = present & (keys.lengths == request_ids.lengths)
    rows = np.flatnonzero(present & same)
    lengths = request_ids.lengths[rows]
    width = int(lengths.max()) if len(rows) else 0
    last = len(buffer) - 1
    for lo in range(0, width, 16):
        spread = np.arange(lo, min(lo + 16, width))
        ours = buffer[np.minimum(request_ids.values[rows, None] + spread, last)]
        theirs = buffer[np.minimum(keys.values[rows, None] + spread, last)]
        same[rows] &= ((ours == theirs) | (spread >= lengths[:, None])).all(axis=1)
    return same


def _decode_rows(
    data: bytes, buffer: Bytes, spans: tuple[Int64s, Int64s, Bools], rows: Int64s
) -> dict[int, Any]:
    starts, ends, present = spans
    values = columnar.decode_spans(data, buffer, starts[rows], ends[rows], present[rows])
    return dict(zip(rows.tolist(), values, strict=True))


def _excluded_groups(
    ids: list[str],
    group: Int64s,
    plain: Bools,
    partitions: Int64s,
    decoded: dict[int, Any],
    config: FoldConfig,
) -> set[int]:
    """Groups the lane must not report: a row it cannot prove, a record of theirs it did not
    walk, rows in two partitions; all of them when the LRU bound could evict."""
    others = {
        value.request_id for value in decoded.values() if type(value) in (CodecChunk, ControlEvent)
    }
    if len(ids) + len(others) > config.tombstone_requests:
        return set(range(len(ids)))
    excluded = set(np.unique(group[~plain]).tolist())
    excluded.update(index for index, rid in enumerate(ids) if rid in others)
    if len(group):
        low = np.full(len(ids), np.iinfo(np.int64).max)
        high = np.full(len(ids), np.iinfo(np.int64).min)
        np.minimum.at(low, group, partitions)
        np.maximum.at(high, group, partitions)
        excluded.update(np.flatnonzero(low != high).tolist())
    return excluded


def _fold_plain(
    ids: list[str],
    group: Int64s,
    rows: Int64s,
    columns: dict[str, Column],
    window: Int64s,
    excluded: set[int],
    config: FoldConfig,
) -> tuple[dict[str, Entry], dict[str, int]]:
    """The report entries of the groups not excluded that stay plain to their last chunk."""
    order = np.argsort(group, kind="stable")  # each group's rows in log order
    bounds = np.flatnonzero(np.diff(group[order])) + 1
    fields = [
        columns["cache_epoch"].values[order].tolist(),
        columns["chunk_seq"].values[order].tolist(),
        window[order].tolist(),
        columns["codec_left_context_frames"].values[order].tolist(),
        columns["last_chunk"].values[order].tolist(),
        columns["tts_is_last_chunk"].values[order].tolist(),
    ]
    first_rows = rows[order].tolist()
    owners = group[order].tolist()
    entries: dict[str, Entry] = {}
    firsts: dict[str, int] = {}
    for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), len(order)], strict=True):
        if lo == hi or owners[lo] in excluded:
            continue
        epochs, seqs, windows, contexts, lasts, ends = (column[lo:hi] for column in fields)
        entry = _plain_stream(epochs, seqs, windows, contexts, lasts, ends, config.lookahead_frames)
        if entry is not None:
            rid = ids[owners[lo]]
            entries[rid] = entry
            firsts[rid] = first_rows[lo]
    return entries, firsts


def _plain_stream(
    epochs: list[int],
    seqs: list[int],
    windows: list[int],
    contexts: list[int],
    lasts: list[int],
    ends: list[int],
    lookahead: int,
) -> Entry | None:
    """One request's report entry by rules T5, T8, A1, A2, A4, or None at the first chunk
    another rule would take (the fold then replays the request)."""
    outcomes: list[dict[str, Any]] = []
    epoch, last_seq, is_open = -1, -1, False
    held = 0
    held_seqs: list[int] = []
    for e, seq, frames, context, last, end in zip(
        epochs, seqs, windows, contexts, lasts, ends, strict=True
    ):
        if is_open and e == epoch:
            if seq != last_seq + 1:
                return None  # T6/T7: a redelivery or a gap
        elif e > epoch and seq == 0:  # T5: a fresh stream (the open one, if any, dropped)
            if held:
                outcomes.append({"kind": "abandoned", "cache_epoch": epoch, "frames": held})
                held, held_seqs = 0, []
            epoch, is_open = e, True
        else:
            return None  # T3/T4, or T5 with a gap
        last_seq = seq
        if frames == 0:
            if last:  # A1
                if held:
                    outcomes.append(_decode(epoch, held_seqs, held, True))
                    held, held_seqs = 0, []
                outcomes.append({"kind": "release", "cache_epoch": epoch})
                is_open = False
            elif end:  # A2
                outcomes.append({"kind": "marker", "cache_epoch": epoch, "chunk_seq": seq})
            else:
                return None  # A3: a reject
            continue
        if held:  # A4 with frames held: this chunk's repeated left context is dropped
            held += frames - min(max(context, 0), frames)
            held_seqs.append(seq)
            if not last and held <= lookahead:
                outcomes.append(_hold(epoch, seq, held))
                continue
            outcomes.append(_decode(epoch, held_seqs, held, bool(last)))
            held, held_seqs = 0, []
        elif last or frames > lookahead:  # A4
            outcomes.append(_decode(epoch, [seq], frames, bool(last)))
        else:
            held, held_seqs = frames, [seq]
            outcomes.append(_hold(epoch, seq, held))
            continue
        if last:
            outcomes.append({"kind": "release", "cache_epoch": epoch})
            is_open = False
    return {"status": "open" if is_open else "released", "outcomes": outcomes}


def _decode(epoch: int, seqs: list[int], frames: int, final: bool) -> dict[str, Any]:
    return {
        "kind": "decode",
        "cache_epoch": epoch,
        "chunk_seqs": seqs,
        "frames": frames,
        "final": final,
    }


def _hold(epoch: int, seq: int, frames: int) -> dict[str, Any]:
    return {"kind": "hold", "cache_epoch": epoch, "chunk_seq": seq, "frames": frames}
