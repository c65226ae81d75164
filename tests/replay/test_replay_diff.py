"""`codeclog diff`: the first divergence per request, for captures and for reports."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from codeclog.replay.capture_format import read_capture
from codeclog.replay.diff import diff_captures, diff_reports
from codeclog.replay.synthetic import metadata_for, write_capture
from codeclog.schemas.wire import decode, encode

RunCli = Callable[[Sequence[str]], tuple[int, str, str]]  # the run_cli fixture

SCENARIO = Path(__file__).resolve().parents[1] / "data" / "scenarios"


def _records(path: Path) -> list[Any]:
    return read_capture(path)[1]


def test_identical_captures_have_no_divergence(synthetic_capture: Path, run_cli: RunCli) -> None:
    assert diff_captures(_records(synthetic_capture), _records(synthetic_capture)) == []
    code, out, _ = run_cli(["diff", str(synthetic_capture), str(synthetic_capture)])
    assert (code, out.startswith("identical")) == (0, True)


def test_offsets_are_positions_not_content(synthetic_capture: Path) -> None:
    records = _records(synthetic_capture)
    moved = [dataclasses.replace(r, offset=r.offset + 1000, partition=7) for r in records]
    assert diff_captures(records, moved) == []


def test_the_first_changed_value_of_a_request_is_reported(
    synthetic_capture: Path, tmp_path: Path, run_cli: RunCli
) -> None:
    records = _records(synthetic_capture)
    key = records[0].key
    mine = [i for i, r in enumerate(records) if r.key == key]
    changed = list(records)
    for index in mine[2:4]:  # two changes: only the first one is reported
        chunk = decode(changed[index].value)
        changed[index] = dataclasses.replace(
            changed[index], value=encode(dataclasses.replace(chunk, chunk_seq=chunk.chunk_seq + 9))
        )
    [divergence] = diff_captures(records, changed)
    original = records[mine[2]]
    assert divergence.request_id == key.decode()
    assert divergence.index == 2
    assert divergence.position_a == f"p{original.partition}@{original.offset}"
    assert divergence.chunk_seq == decode(original.value).chunk_seq
    assert "chunk_seq" in divergence.what and "vs" in divergence.what
    path = tmp_path / "changed.ocf"
    write_capture(path, changed, metadata_for(changed, partitions=4))
    code, out, _ = run_cli(["diff", str(synthetic_capture), str(path), "--json"])
    assert code == 1
    assert json.loads(out)[0]["index"] == 2


def test_a_missing_record_is_a_divergence(synthetic_capture: Path) -> None:
    records = _records(synthetic_capture)
    last_of_first = max(i for i, r in enumerate(records) if r.key == records[0].key)
    shorter = records[:last_of_first] + records[last_of_first + 1 :]
    [divergence] = diff_captures(records, shorter)
    assert divergence.what == "record missing in B"
    assert divergence.position_b == ""


def _report(name: str, policy: str, run_cli: RunCli) -> dict[str, Any]:
    code, out, _ = run_cli(
        ["replay", str(SCENARIO / f"{name}.jsonl"), "--policy", policy, "--json"]
    )
    assert code == 0
    return json.loads(out)


def test_identical_reports_have_no_divergence(run_cli: RunCli) -> None:
    report = _report("04_redelivery_conflict_and_gap", "tolerant", run_cli)
    assert diff_reports(report, copy.deepcopy(report)) == []


def test_strict_and_tolerant_reports_diverge_where_the_stage_died(run_cli: RunCli) -> None:
    strict = _report("03_boundary_placeholder_stripped", "strict", run_cli)
    tolerant = _report("03_boundary_placeholder_stripped", "tolerant", run_cli)
    divergences = diff_reports(strict, tolerant)
    stage = [d.what for d in divergences if d.request_id is None]
    assert stage[:3] == ["policy 'strict' vs 'tolerant'", "events 2 vs 6", "unprocessed 4 vs 0"]
    assert stage[3].startswith("stage.fatal {")
    by_request = {d.request_id: d for d in divergences if d.request_id is not None}
    assert by_request["a"].what == "outcome missing in A (decode)"
    assert (by_request["a"].index, by_request["a"].position_b) == (1, "outcome 1")
    assert by_request["b"].what.startswith("reject: ")
    assert "kind 'reject' vs 'hold'" in by_request["b"].what
    assert (by_request["b"].index, by_request["b"].chunk_seq) == (0, 0)


@pytest.mark.parametrize(
    ("mutate", "expected_what"),
    [
        (lambda r: r["requests"]["r1"]["outcomes"][1].update(frames=99), "decode: frames 28 vs 99"),
        (lambda r: r["requests"]["r1"]["outcomes"].pop(), "outcome missing in B (release)"),
        (lambda r: r["requests"]["r1"].update(status="open"), "status released vs open"),
        (lambda r: r["requests"]["r1"].update(audio={"sha256": "x"}), "audio sha256 None vs 'x'"),
    ],
)
def test_report_divergences_name_what_differs(
    mutate: Callable[[dict[str, Any]], None], expected_what: str, run_cli: RunCli
) -> None:
    report = _report("01_clean_turn", "tolerant", run_cli)
    other = copy.deepcopy(report)
    mutate(other)
    [divergence] = diff_reports(report, other)
    assert expected_what in divergence.what
    assert divergence.request_id == "r1"
