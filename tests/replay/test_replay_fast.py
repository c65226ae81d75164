"""The state-only replay of a capture read as columns (replay.columns, replay.fast) gives the
report of the shared pipeline byte for byte, dead letters included, for clean captures, the
scenario-derived ones, captures with poison records, and captures it must not read as columns."""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path

import pytest

from consumers.fold.machine import Policy
from consumers.fold.scenario import read_scenario
from consumers.fold.synth import realistic_events
from replay.capture_format import CapturedRecord, RecordHeader, read_capture
from replay.columns import read_table
from replay.errors import CaptureFormatError
from replay.inputs import InputKind, ReplayInput, load_input, log_order
from replay.runner import ReplayOptions, replay, report_json
from replay.synthetic import metadata_for, records_from_events, write_capture
from schemas import wire
from schemas.records import AudioChunk, CodecChunk, ControlEvent

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


def test_equal_positions_keep_their_file_order(tmp_path: Path) -> None:
    records = records_from_events(realistic_events(random.Random(6), sessions=3, turns=1), 1)
    doubled = [records[0], *records]  # a record captured twice: the same (partition, offset)
    doubled[1] = dataclasses.replace(doubled[1], key=b"other")
    assert_same_replay(_write(tmp_path, doubled, 1, "doubled.ocf"))
