"""Replaying captures: same outcomes as folding the events, log order, dead letters, provenance,
byte-identical output across processes, WAV files, user errors."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import subprocess
import sys
import wave
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from codeclog.consumers.stream.fold.report import build_report
from codeclog.consumers.stream.fold.state import FoldConfig, Policy
from codeclog.replay.capture_format import read_capture
from codeclog.replay.inputs import InputKind, load_input, log_order
from codeclog.replay.runner import ReplayOptions, replay, report_json
from codeclog.replay.wav import wav_name, write_wavs
from codeclog.schemas.wire import decode
from codeclog.testing.upstream_streams import realistic_events
from tests.replay.captures import write_events

RunCli = Callable[[Sequence[str]], tuple[int, str, str]]  # the run_cli fixture

REPO = Path(__file__).resolve().parents[2]


def test_a_capture_is_read_in_log_order(synthetic_capture: Path) -> None:
    source = load_input(synthetic_capture)
    assert source.kind is InputKind.CAPTURE
    positions = [(r.partition, r.offset) for r in source.records]
    assert positions == sorted(positions)
    assert any(b - a > 1 for (p, a), (q, b) in itertools.pairwise(positions) if p == q)  # gaps


@pytest.mark.parametrize("policy", list(Policy))
def test_capture_replay_gives_the_outcomes_of_folding_its_events(
    synthetic_capture: Path, policy: Policy
) -> None:
    report = replay(load_input(synthetic_capture), ReplayOptions(policy)).report
    _, records, _ = read_capture(synthetic_capture)
    events = [decode(r.value) for r in log_order(records)]
    expected = build_report(events, FoldConfig(policy=policy))
    assert {key: report[key] for key in expected} == expected
    assert report["provenance"]["topic"] == "codec.chunks"
    assert report["provenance"]["partition_count"] == 4
    assert report["input"]["kind"] == "capture"


def test_undecodable_records_become_dead_letters_not_crashes(tmp_path: Path) -> None:
    events = realistic_events(random.Random(1), sessions=2, turns=1)
    path = tmp_path / "bad.ocf"
    records = write_events(path, events, 2, damaged={1: b"not avro at all", 2: None})
    report = replay(load_input(path), ReplayOptions(Policy.TOLERANT)).report
    assert report["dead_letters"]["by_reason"]["undecodable_record"] == 2
    assert report["events"] == len(records) - 2


def test_strict_replay_of_a_capture_stops_every_partition_at_the_first_rejection(
    tmp_path: Path,
) -> None:
    events = realistic_events(random.Random(3), sessions=30, turns=2)
    bad = next(i for i, e in enumerate(events) if e.chunk_seq == 1)
    events[bad] = dataclasses.replace(events[bad], chunk_seq=7)  # out of order: S6
    path = tmp_path / "strict.ocf"
    records = write_events(path, events, 4)
    report = replay(load_input(path), ReplayOptions(Policy.STRICT)).report
    assert report["stage"]["fatal"]["reason"] == "stale_or_reordered_chunk"
    assert report["events"] + report["unprocessed"] == len(records)
    assert report["unprocessed"] > 0


def _run_subprocess(*argv: str) -> bytes:
    result = subprocess.run(
        [sys.executable, "-m", "codeclog.cli", *argv],
        cwd=REPO,
        capture_output=True,
        check=True,
        timeout=120,
    )
    return result.stdout


def test_two_processes_print_byte_identical_reports(synthetic_capture: Path) -> None:
    first = _run_subprocess("replay", str(synthetic_capture), "--json", "--policy", "strict")
    second = _run_subprocess("replay", str(synthetic_capture), "--json", "--policy", "strict")
    assert first == second
    assert json.loads(first)["events"] > 0


def test_report_json_sorts_keys() -> None:
    assert report_json({"b": 1, "a": {"d": 2, "c": 3}}) == (
        '{\n "a": {\n  "c": 3,\n  "d": 2\n },\n "b": 1\n}\n'
    )


@pytest.mark.parametrize(
    ("request_id", "expected"),
    [
        ("r1", "r1.wav"),
        ("session-00001", "session-00001.wav"),
        ("a/b", "a_b-"),
        ("a_b", "a_b.wav"),
        ("", "request-"),
        ("..", "..-"),
    ],
)
def test_wav_names_are_safe_and_distinct(request_id: str, expected: str) -> None:
    name = wav_name(request_id)
    assert name.startswith(expected) and name.endswith(".wav")
    assert "/" not in name


def test_write_wavs_writes_24khz_mono_16bit(tmp_path: Path) -> None:
    pcm = bytes(range(256)) * 10
    paths = write_wavs(tmp_path / "wav", {"r1": pcm, "a/b": pcm[:100]})
    with wave.open(str(paths["r1"])) as wav:
        params = (wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes())
        assert params == (1, 2, 24000, len(pcm) // 2)
        assert wav.readframes(wav.getnframes()) == pcm
    assert paths["a/b"].name != "a_b.wav"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["replay", "/nonexistent/x.ocf"], "cannot read"),
        (["replay", "{tmp}/garbage.jsonl"], "neither a capture file nor a valid JSONL scenario"),
        (["replay", "{scenario}", "--wav-dir", "{tmp}/w"], "--wav-dir needs audio"),
        (["replay", "{scenario}", "--hift", "causal"], "--hift and --dtype choose the vocoder"),
        (["replay", "{scenario}", "--vocoder", "tiny", "--dtype", "float16"], "is for CUDA"),
        (["replay", "{scenario}", "--to-topic", "t", "--json"], "--to-topic republishes only"),
        (["diff", "{scenario}", "{capture}"], "cannot compare a capture with a report"),
        (["diff", "{scenario}", "{scenario}"], "neither a capture nor a JSON replay report"),
        (["capture", "--out", "{tmp}/x.ocf", "--from", "yesterday"], "is not an offset"),
    ],
)
def test_user_errors_are_one_sentence_without_traceback(
    argv: list[str], message: str, tmp_path: Path, synthetic_capture: Path, run_cli: RunCli
) -> None:
    (tmp_path / "garbage.jsonl").write_text("this is not json\n")
    scenario = REPO / "tests" / "data" / "scenarios" / "01_clean_turn.jsonl"
    fill = {"tmp": str(tmp_path), "scenario": str(scenario), "capture": str(synthetic_capture)}
    code, _out, err = run_cli([arg.format(**fill) for arg in argv])
    assert code in (1, 2)
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
