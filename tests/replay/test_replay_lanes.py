"""The plain lane (replay.lanes) reports exactly what the fold would, and does take plain requests.

The reference is the shared pipeline's replay of the same capture read record by record (no
lane, no columns): equal report JSON and dead-letter reasons, for streams perturbed in every way
the lane must notice (redeliveries, gaps, reordering, stale and reopened epochs, abandoned held
frames, empty non-final chunks, invalid ids and frame counts, control events, missing ids, key
mismatches, a request in two partitions, undecodable values) and in ways it must follow (holds
merged across windows with any left context, placeholders, open streams at the end).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.consumers.fold.machine import FoldConfig
from codeclog.consumers.fold.report import build_report
from codeclog.replay import fast
from codeclog.replay.capture_format import CapturedRecord, read_capture
from codeclog.replay.columns import read_table
from codeclog.replay.inputs import InputKind, ReplayInput, load_input, log_order
from codeclog.replay.lanes import plain_lane
from codeclog.replay.runner import STEP_RECORDS, ReplayOptions, replay, report_json
from codeclog.replay.synthetic import metadata_for, records_from_events, write_capture
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind
from codeclog.testing.upstream_streams import (
    StreamShape,
    interleave,
    realistic_events,
    session_stream,
)

Event = CodecChunk | ControlEvent


def _shape(rng: random.Random) -> StreamShape:
    """Small windows, so that holds, merges and every left context happen."""
    return StreamShape(
        chunk_frames=rng.randint(1, 6),
        left_context_frames=rng.choice([0, 0, 1, 3]),
        initial_frames=rng.randint(1, 6),
        preroll=rng.random() < 0.5,
        min_unit_frames=rng.randint(0, 3),
    )


def _perturb(rng: random.Random, stream: list[Event]) -> list[Event]:
    """One random change a real log can carry (or none)."""
    if not stream:
        return stream
    out = list(stream)
    at = rng.randrange(len(out))
    chunk = out[at]
    kind = rng.randrange(14)
    if kind == 0:  # a redelivery, later
        out.insert(rng.randint(at + 1, len(out)), chunk)
    elif kind == 1 and len(out) > 1:  # a lost chunk
        del out[at]
    elif kind == 2 and at + 1 < len(out):  # two chunks swapped
        out[at], out[at + 1] = out[at + 1], out[at]
    elif kind == 3 and isinstance(chunk, CodecChunk):  # the epoch cut here: the next one starts
        rest = [e for e in out[at:] if getattr(e, "cache_epoch", None) != chunk.cache_epoch]
        out = out[:at] + rest  # while this one is open (abandoning held frames)
    elif kind == 4 and isinstance(chunk, CodecChunk):  # an empty non-final chunk
        out[at] = dataclasses.replace(chunk, code_flat_numel=0, last_chunk=False)
        out[at] = dataclasses.replace(out[at], tts_is_last_chunk=False)
    elif kind == 5 and isinstance(chunk, CodecChunk) and chunk.codes:  # an invalid id
        out[at] = dataclasses.replace(chunk, codes=(7000, *chunk.codes[1:]))
    elif kind == 6 and isinstance(chunk, CodecChunk):  # a frame count beyond the codes
        out[at] = dataclasses.replace(chunk, code_flat_numel=len(chunk.codes) + 1)
    elif kind == 7 and isinstance(chunk, CodecChunk):  # a stale epoch
        out.insert(at, dataclasses.replace(chunk, cache_epoch=chunk.cache_epoch - 1))
    elif kind == 8:
        control = rng.choice(list(ControlKind))
        out.insert(at, ControlEvent(chunk.request_id, control))
    elif kind == 9 and isinstance(chunk, CodecChunk):  # no request id
        out.insert(at, dataclasses.replace(chunk, request_id=""))
    elif kind == 10 and isinstance(chunk, CodecChunk):  # a conflicting redelivery
        out.insert(at + 1, dataclasses.replace(chunk, codes=(*chunk.codes, 1)))
    elif kind == 11 and isinstance(chunk, CodecChunk):  # the frame count spelled out, or not
        numel = None if chunk.code_flat_numel == len(chunk.codes) else chunk.code_flat_numel
        out[at] = dataclasses.replace(chunk, code_flat_numel=numel)
    return out


def _events(seed: int, sessions: int, perturbed: float) -> list[Event]:
    rng = random.Random(seed)
    streams: list[list[Event]] = []
    for index in range(sessions):
        stream: list[Event] = list(session_stream(rng, f"r{index}", rng.randint(1, 3), _shape(rng)))
        if rng.random() < 0.3:  # an open stream at the end of the capture
            stream = stream[: rng.randint(1, len(stream))]
        while rng.random() < perturbed:
            stream = _perturb(rng, stream)
        streams.append(stream)
    return interleave(rng, streams)


def _records(seed: int, records: list[CapturedRecord], partitions: int) -> list[CapturedRecord]:
    """A few records with another key, none, a torn value, or in another partition."""
    rng = random.Random(seed)
    records = list(records)
    for index in rng.sample(range(len(records)), min(3, len(records))):
        record = records[index]
        choice = rng.randrange(4)
        if choice == 0:
            records[index] = dataclasses.replace(record, key=b"someone-else")
        elif choice == 1:
            records[index] = dataclasses.replace(record, key=None)
        elif choice == 2 and record.value:
            records[index] = dataclasses.replace(record, value=record.value[:-1])
        else:  # the request's record lands in another partition
            moved = (record.partition + 1) % partitions
            records[index] = dataclasses.replace(record, partition=moved, offset=1000 + index)
    return records


def _write(path: Path, records: list[CapturedRecord], partitions: int) -> Path:
    write_capture(path, records, metadata_for(records, partitions=partitions), block_records=9)
    return path


def _record_by_record(path: Path) -> ReplayInput:
    metadata, records, truncated = read_capture(path)
    return ReplayInput(
        InputKind.CAPTURE, path.name, metadata, log_order(records), truncated=truncated
    )


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sessions=st.integers(1, 12),
    partitions=st.integers(1, 4),
    perturbed=st.sampled_from([0.0, 0.3, 0.7]),
)
def test_the_lane_reports_what_the_fold_reports(
    seed: int, sessions: int, partitions: int, perturbed: float, tmp_path_factory: object
) -> None:
    events = _events(seed, sessions, perturbed)
    records = records_from_events(events, partitions=partitions)
    if perturbed:
        records = _records(seed, records, partitions)
    path = _write(tmp_path_factory.mktemp("lanes") / "c.ocf", records, partitions)  # type: ignore[attr-defined]
    source = load_input(path)
    assert source.table is not None
    lanes = replay(source, ReplayOptions(workers=1))
    folded = replay(_record_by_record(path), ReplayOptions(workers=1))
    assert report_json(lanes.report) == report_json(folded.report)


def test_a_newer_epoch_abandons_held_frames_in_the_lane_too(tmp_path: Path) -> None:
    def chunk(epoch: int, seq: int, codes: tuple[int, ...], last: bool = False) -> CodecChunk:
        return CodecChunk("r", codes, cache_epoch=epoch, chunk_seq=seq, last_chunk=last)

    events = [chunk(0, 0, (1, 2)), chunk(0, 1, (3,)), chunk(1, 0, (4, 5, 6, 7), last=True)]
    path = _write(tmp_path / "abandon.ocf", records_from_events(events, partitions=1), 1)
    assert _lane_of(path) == (0, {"r"})
    report = replay(load_input(path), ReplayOptions()).report
    assert report_json(report) == report_json(
        replay(_record_by_record(path), ReplayOptions()).report
    )
    kinds = [outcome["kind"] for outcome in report["requests"]["r"]["outcomes"]]
    assert kinds == ["hold", "hold", "abandoned", "decode", "release"]


def _lane_of(path: Path, config: FoldConfig | None = None) -> tuple[int, set[str]]:
    table = read_table(path)
    assert table is not None
    lane = plain_lane(
        table.data,
        table.buffer,
        table.value_spans(),
        table.key_column(),
        table.partitions,
        config or FoldConfig(),
    )
    return len(lane.fallback), set(lane.entries)


def test_plain_requests_take_the_lane(tmp_path: Path) -> None:
    events = realistic_events(random.Random(3), sessions=30, turns=3)
    path = _write(tmp_path / "clean.ocf", records_from_events(events, partitions=4), 4)
    fallback, plain = _lane_of(path)
    assert fallback == 0
    assert plain == {f"session-{index:05d}" for index in range(30)}


def test_only_the_requests_the_lane_cannot_prove_fall_back(tmp_path: Path) -> None:
    events = realistic_events(random.Random(5), sessions=10, turns=2)
    first = next(i for i, e in enumerate(events) if e.request_id == "session-00003")
    second = next(i for i, e in enumerate(events) if e.request_id == "session-00007")
    events[first] = dataclasses.replace(events[first], chunk_seq=5)  # a gap
    events.insert(second + 1, events[second])  # a redelivery: the fold says duplicate
    records = records_from_events(events, partitions=2)
    path = _write(tmp_path / "two.ocf", records, 2)
    fallback, plain = _lane_of(path)
    expected = sum(e.request_id in ("session-00003", "session-00007") for e in events)
    assert fallback == expected
    assert plain == {f"session-{i:05d}" for i in range(10)} - {"session-00003", "session-00007"}
    assert report_json(replay(load_input(path), ReplayOptions()).report) == report_json(
        replay(_record_by_record(path), ReplayOptions()).report
    )


def test_the_lane_is_off_when_the_tombstone_lru_could_evict(tmp_path: Path) -> None:
    events = realistic_events(random.Random(8), sessions=6, turns=1)
    path = _write(tmp_path / "lru.ocf", records_from_events(events, partitions=1), 1)
    assert _lane_of(path, FoldConfig(tombstone_requests=6))[0] == 0
    fallback, plain = _lane_of(path, FoldConfig(tombstone_requests=5))
    assert (fallback, plain) == (len(events), set())
    table = read_table(path)
    assert table is not None
    config = FoldConfig(tombstone_requests=2)
    report, _ = fast._replay_range(table, config, STEP_RECORDS, None, 0, len(table))
    assert report == build_report(events, config)
