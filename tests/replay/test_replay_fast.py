"""The state-only replay of a capture read as columns (replay.columns, replay.fast) gives the
report of the shared pipeline byte for byte, dead letters included, for clean captures, the
scenario-derived ones, captures with poison records, and captures it must not read as columns."""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.consumers.stream.fold.state import Policy
from codeclog.consumers.stream.limit import LimitOptions
from codeclog.replay import columns, fast
from codeclog.replay.capture_format import CapturedRecord, RecordHeader, read_capture
from codeclog.replay.columns import read_table
from codeclog.replay.errors import CaptureFormatError
from codeclog.replay.inputs import InputKind, ReplayInput, load_input, log_order
from codeclog.replay.runner import ReplayOptions, replay, report_json
from codeclog.replay.scenario import read_scenario
from codeclog.replay.synthetic import metadata_for, records_from_events, write_capture
from codeclog.schemas import wire
from codeclog.schemas.avro_walk import padded
from codeclog.schemas.records import AudioChunk, CodecChunk, ControlEvent, ControlKind
from codeclog.testing.upstream_streams import (
    StreamShape,
    interleave,
    realistic_events,
    session_stream,
)

Event = CodecChunk | ControlEvent
SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "data" / "scenarios").glob("*.jsonl"))


def _pipeline_input(path: Path) -> ReplayInput:
    """The capture as the shared pipeline replays it: records from read_capture, no table."""
    metadata, records, truncated = read_capture(path)
    return ReplayInput(
        InputKind.CAPTURE, path.name, metadata, log_order(records), truncated=truncated
    )


def assert_same_replay(path: Path, columnar: bool = True) -> None:
    source = load_input(path)
    assert (source.table is not None) is columnar
    reference = _pipeline_input(path)
    assert tuple(source.records) == tuple(reference.records)
    assert source.truncated == reference.truncated
    for policy in Policy:
        fast = replay(source, ReplayOptions(policy)).report
        slow = replay(reference, ReplayOptions(policy)).report
        assert report_json(fast) == report_json(slow)


def _write(tmp_path: Path, records: list[CapturedRecord], partitions: int, name: str) -> Path:
    path = tmp_path / name
    write_capture(path, records, metadata_for(records, partitions=partitions), block_records=7)
    return path


def _encodable(event: CodecChunk | ControlEvent) -> bool:
    try:
        wire.encode(event)
    except wire.EncodeError:
        return False
    return True


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_captures_replay_identically(scenario: Path, tmp_path: Path) -> None:
    events = [e for e in read_scenario(scenario) if _encodable(e)]
    records = records_from_events(events, partitions=3, txn_records=4)
    assert_same_replay(_write(tmp_path, records, 3, "scenario.ocf"))


def test_a_realistic_capture_replays_identically(synthetic_capture: Path) -> None:
    assert_same_replay(synthetic_capture)


def _poisoned(seed: int) -> list[CapturedRecord]:
    rng = random.Random(seed)
    events = realistic_events(rng, sessions=12, turns=2)
    records = records_from_events(events, partitions=4)
    audio = wire.encode(AudioChunk("x", 0, (1,), 0, 0, 24000, b"\0\0", "00", False))
    poisons: list[bytes | None] = [None, b"", b"not avro", b"\xc3", audio, b"\xc3\x01" + b"\0" * 8]
    for index in rng.sample(range(len(records)), 40):
        value = records[index].value or b""
        choice = rng.randrange(6)
        if choice == 0:
            value = value[: rng.randrange(len(value))]
        elif choice == 1:
            value = value + b"\x00"
        elif choice == 2:
            at = rng.randrange(len(value))
            value = value[:at] + bytes([rng.randrange(256)]) + value[at + 1 :]
        elif choice == 3:
            records[index] = dataclasses.replace(records[index], key=b"someone-else")
            continue
        elif choice == 4:
            records[index] = dataclasses.replace(records[index], key=None)
            continue
        else:
            value = rng.choice(poisons)  # type: ignore[assignment]
        records[index] = dataclasses.replace(records[index], value=value)
    return records


@pytest.mark.parametrize("seed", range(6))
def test_poison_records_replay_identically(seed: int, tmp_path: Path) -> None:
    records = _poisoned(seed)
    path = _write(tmp_path, records, 4, "poison.ocf")
    assert_same_replay(path)
    report = replay(load_input(path), ReplayOptions()).report
    assert report["dead_letters"]["total"] > 0


def test_a_capture_with_headers_is_read_record_by_record(tmp_path: Path) -> None:
    records = records_from_events(realistic_events(random.Random(2), sessions=3, turns=1), 2)
    records[1] = dataclasses.replace(records[1], headers=(RecordHeader("trace", b"1"),))
    path = _write(tmp_path, records, 2, "headers.ocf")
    assert read_table(path) is None
    assert_same_replay(path, columnar=False)


def test_a_torn_capture_keeps_its_whole_blocks(tmp_path: Path) -> None:
    records = records_from_events(realistic_events(random.Random(4), sessions=4, turns=1), 2)
    whole = _write(tmp_path, records, 2, "whole.ocf").read_bytes()
    rng = random.Random(9)
    for cut in sorted(rng.sample(range(len(whole)), 16)):
        torn = tmp_path / f"torn-{cut}.ocf"
        torn.write_bytes(whole[:cut])
        try:
            expected = read_capture(torn)
        except CaptureFormatError as exc:  # cut inside the header: both refuse it alike
            with pytest.raises(CaptureFormatError, match=re.escape(str(exc))):
                load_input(torn)
            continue
        assert expected[2] or cut == len(whole)
        assert_same_replay(torn)


def test_a_record_of_another_topic_is_read_record_by_record(tmp_path: Path) -> None:
    """The column reader follows records by their topic field: another topic breaks the chain,
    and the capture is read (and replayed) the old way, with the same result."""
    records = records_from_events(realistic_events(random.Random(3), sessions=3, turns=1), 2)
    records[4] = dataclasses.replace(records[4], topic="codec.chunks.other")
    path = _write(tmp_path, records, 2, "topics.ocf")
    assert read_table(path) is None
    assert_same_replay(path, columnar=False)


def test_a_block_whose_first_topic_is_not_utf8_is_not_a_table(tmp_path: Path) -> None:
    """A block's first record is found by its place, not by the first record's topic bytes, so
    its topic is checked as UTF-8 (fastavro's reader would fail the block)."""
    records = records_from_events(realistic_events(random.Random(3), sessions=3, turns=1), 2)
    path = _write(tmp_path, records, 2, "topics.ocf")
    with open(path, "rb") as fo:
        blocks = columns._read_blocks(fo)
    assert columns._find_records(blocks, padded(blocks.data)) is not None
    topic = records[0].topic.encode()
    at = blocks.starts[1] + 1  # the second block's first record: its topic, after its length
    assert blocks.data[at : at + len(topic)] == topic
    data = blocks.data[:at] + topic[:-1] + b"\xff" + blocks.data[at + len(topic) :]
    assert columns._find_records(dataclasses.replace(blocks, data=data), padded(data)) is None


def test_an_empty_capture_is_a_table(tmp_path: Path) -> None:
    path = _write(tmp_path, [], 2, "empty.ocf")
    table = read_table(path)
    assert table is not None and len(table) == 0
    assert_same_replay(path)


def test_equal_positions_keep_their_file_order(tmp_path: Path) -> None:
    records = records_from_events(realistic_events(random.Random(6), sessions=3, turns=1), 1)
    doubled = [records[0], *records]  # a record captured twice: the same (partition, offset)
    doubled[1] = dataclasses.replace(doubled[1], key=b"other")
    assert_same_replay(_write(tmp_path, doubled, 1, "doubled.ocf"))


# -- perturbed streams, with and without the open-stream cap ------------------------------------


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
        empty = dataclasses.replace(chunk, code_flat_numel=0, last_chunk=False)
        out[at] = dataclasses.replace(empty, tts_is_last_chunk=False)
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


def _misplaced(seed: int, records: list[CapturedRecord], partitions: int) -> list[CapturedRecord]:
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


def assert_same_for(path: Path, options: ReplayOptions) -> dict[str, Any]:
    """The table path and the pipeline's path give the same report bytes; returns the report."""
    source = load_input(path)
    assert source.table is not None
    fast_report = replay(source, options).report
    assert report_json(fast_report) == report_json(replay(_pipeline_input(path), options).report)
    return fast_report


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sessions=st.integers(1, 12),
    partitions=st.integers(1, 4),
    perturbed=st.sampled_from([0.0, 0.3, 0.7]),
    policy=st.sampled_from(list(Policy)),
    cap=st.sampled_from([None, 1, 2, 3, 5]),
)
def test_perturbed_streams_replay_identically(
    seed: int,
    sessions: int,
    partitions: int,
    perturbed: float,
    policy: Policy,
    cap: int | None,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Redeliveries, gaps, reordering, stale and reopened epochs, abandoned held frames, empty
    non-final chunks, invalid ids and frame counts, control events, missing ids, key
    mismatches, a request in two partitions, undecodable values; open streams at the end; and
    an open-stream cap per partition (`--max-open-streams cap * partitions`) that evicts."""
    events = _events(seed, sessions, perturbed)
    records = records_from_events(events, partitions=partitions)
    if perturbed:
        records = _misplaced(seed, records, partitions)
    path = _write(tmp_path_factory.mktemp("perturbed"), records, partitions, "c.ocf")
    limits = LimitOptions() if cap is None else LimitOptions(cap * partitions)
    assert_same_for(path, ReplayOptions(policy, workers=1, limits=limits))


def test_the_cap_evicts_on_the_table_path_as_in_the_pipeline(tmp_path: Path) -> None:
    """C1a: 30 sessions interleaved on 2 partitions, at most 2 open streams per partition."""
    events = realistic_events(random.Random(12), sessions=30, turns=2)
    path = _write(tmp_path, records_from_events(events, partitions=2), 2, "cap.ocf")
    report = assert_same_for(path, ReplayOptions(workers=1, limits=LimitOptions(4)))
    reasons = Counter(report["dead_letters"]["by_reason"])
    assert reasons["evicted"] > 0
    assert report["stream_limit"].startswith("at most 2 open streams per partition")


# -- several processes --------------------------------------------------------------------------


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the test captures (hundreds of records) be split across processes."""
    monkeypatch.setattr(fast, "MIN_RECORDS_PER_WORKER", 10)


def assert_same_for_any_workers(path: Path) -> None:
    source = load_input(path)
    assert source.table is not None
    one = report_json(replay(source, ReplayOptions(workers=1)).report)
    for workers in (2, 3, 5):
        assert report_json(replay(source, ReplayOptions(workers=workers)).report) == one


@pytest.mark.usefixtures("small_parts")
def test_workers_give_the_same_report(synthetic_capture: Path) -> None:
    assert_same_for_any_workers(synthetic_capture)


@pytest.mark.usefixtures("small_parts")
@pytest.mark.parametrize("seed", range(3))
def test_workers_give_the_same_report_with_poison(seed: int, tmp_path: Path) -> None:
    # keyless and mis-keyed records put one request id into several partitions: the parts
    # are then thrown away and one process replays the table
    assert_same_for_any_workers(_write(tmp_path, _poisoned(seed), 4, "poison.ocf"))


@pytest.mark.usefixtures("small_parts")
def test_partition_ranges_cut_only_between_partitions() -> None:
    partitions = [0] * 30 + [1] * 5 + [2] * 40 + [3] * 25
    for workers in range(1, 7):
        ranges = fast._partition_ranges(partitions, workers)
        assert ranges[0][0] == 0 and ranges[-1][1] == len(partitions)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        assert len(ranges) <= workers
        assert all(lo == 0 or partitions[lo] != partitions[lo - 1] for lo, _ in ranges)
    assert fast._partition_ranges(partitions, 2) == [(0, 35), (35, 100)]
    assert fast._partition_ranges([7] * 100, 4) == [(0, 100)]  # one partition: one process


def test_parts_sharing_a_request_are_not_joined() -> None:
    part = {"policy": "tolerant", "events": 1, "unprocessed": 0, "stage": {"fatal": None}}
    a = ({**part, "requests": {"r1": {"status": "open", "outcomes": []}}}, Counter(x=1))
    b = ({**part, "requests": {"r2": {"status": "released", "outcomes": []}}}, Counter(x=2))
    joined = fast._join([a, b])
    assert joined is not None
    assert joined[0]["events"] == 2 and set(joined[0]["requests"]) == {"r1", "r2"}
    assert joined[1] == Counter(x=3)
    assert fast._join([a, a]) is None


@pytest.mark.usefixtures("small_parts")
def test_a_request_in_two_partitions_falls_back_to_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = records_from_events(realistic_events(random.Random(3), sessions=8, turns=2), 4)
    target = records[0].key
    split = [
        dataclasses.replace(r, partition=(r.partition + 2) % 4, offset=10_000 + i)
        if r.key == target and i % 2
        else r
        for i, r in enumerate(records)
    ]
    joins: list[object] = []
    real_join = fast._join
    monkeypatch.setattr(fast, "_join", lambda parts: joins.append(real_join(parts)) or joins[-1])
    path = _write(tmp_path, split, 4, "split.ocf")
    assert_same_for_any_workers(path)
    assert joins and all(joined is None for joined in joins)  # parts were made, then refused
    joins.clear()
    assert_same_for_any_workers(_write(tmp_path, records, 4, "clean.ocf"))
    assert joins and all(joined is not None for joined in joins)  # the parallel path ran


def test_the_cli_splits_a_large_capture_and_prints_the_same_report(
    tmp_path: Path, run_cli: Callable[[Sequence[str]], tuple[int, str, str]]
) -> None:
    """Above the real threshold (no patching): 2 processes and 1 give the same --json bytes."""
    events = realistic_events(random.Random(11), sessions=800, turns=4)
    records = records_from_events(events, partitions=8)
    path = _write(tmp_path, records, 8, "large.ocf")
    assert len(records) >= 2 * fast.MIN_RECORDS_PER_WORKER
    table = load_input(path).table
    assert table is not None
    assert len(fast._partition_ranges(table.partitions.tolist(), 2)) == 2
    outputs = [run_cli(["replay", str(path), "--json", "--workers", n]) for n in ("1", "2")]
    assert [code for code, _, _ in outputs] == [0, 0]
    assert outputs[0][1] == outputs[1][1]
    assert run_cli(["replay", str(path), "--workers", "0"])[0] == 2
