"""Every scenario reproduces its expected report through `codeclog replay --json`, both policies."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from codeclog.replay.summary import upstream_error_text

RunCli = Callable[[Sequence[str]], tuple[int, str, str]]  # the run_cli fixture

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "data" / "scenarios"
SCENARIOS = sorted(SCENARIO_DIR.glob("*.jsonl"))

POLICIES = ("strict", "tolerant")


def test_the_scenarios_are_there() -> None:
    assert len(SCENARIOS) >= 6


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_replay_json_reproduces_the_expected_report(
    scenario: Path, policy: str, run_cli: RunCli
) -> None:
    expected = json.loads(scenario.with_suffix(".expected.json").read_text())[policy]
    code, out, err = run_cli(["replay", str(scenario), "--policy", policy, "--json"])
    assert code == 0, err
    report = json.loads(out)
    assert {key: report[key] for key in expected} == expected
    assert report["input"] == {
        "kind": "scenario",
        "name": scenario.name,
        "size": report["events"] + report["unprocessed"],
        "truncated": False,
    }


STRICT_SIGNATURES = [
    (
        "02_new_epoch_admitting_chunk_lost",
        [
            "new_epoch_requires_first_chunk",
            "epoch 1, seq 1",
            'MiniCPMO45Code2WavBatchError {"cache_epoch":1,"chunk_seq":1,'
            '"reason":"new_epoch_requires_first_chunk","request_id":"r1"}',
            "requests it would have killed: r1",
        ],
    ),
    (
        "03_boundary_placeholder_stripped",
        [
            'MiniCPMO45Code2WavBatchError {"frames":1,"minimum":4,'
            '"reason":"chunk_below_lookahead_window"}',
            "requests it would have killed: a, b",
        ],
    ),
]


@pytest.mark.parametrize(
    ("name", "signatures"), STRICT_SIGNATURES, ids=[n for n, _ in STRICT_SIGNATURES]
)
def test_strict_summary_prints_the_upstream_error(
    name: str, signatures: list[str], run_cli: RunCli
) -> None:
    code, out, _ = run_cli(["replay", str(SCENARIO_DIR / f"{name}.jsonl"), "--policy", "strict"])
    assert code == 0
    for signature in signatures:
        assert signature in out


def test_tolerant_summary_has_no_fatal_section(run_cli: RunCli) -> None:
    scenario = SCENARIO_DIR / "03_boundary_placeholder_stripped.jsonl"
    code, out, _ = run_cli(["replay", str(scenario)])
    assert code == 0
    assert "FATAL" not in out
    assert "MiniCPMO45Code2WavBatchError" not in out


def test_summary_table_lists_every_request_with_its_status(run_cli: RunCli) -> None:
    scenario = SCENARIO_DIR / "04_redelivery_conflict_and_gap.jsonl"
    _, out, _ = run_cli(["replay", str(scenario)])
    row = next(line for line in out.splitlines() if line.startswith("r1 "))
    assert row.split()[:3] == ["r1", "released", "3"]
    assert "conflicting_duplicate=1" in row
    assert "gap=1" in row


def test_upstream_error_text_matches_the_fold_strict_error_json() -> None:
    from codeclog.consumers.stream.fold.outcomes import Reject, RejectReason
    from codeclog.consumers.stream.fold.report import strict_error_json

    reject = Reject(
        request_id="b",
        reason=RejectReason.CHUNK_BELOW_LOOKAHEAD_WINDOW,
        cache_epoch=0,
        chunk_seq=0,
        details=(("frames", 1), ("minimum", 4)),
    )
    text = upstream_error_text(reject.reason.value, reject.details_dict())
    assert text == f"MiniCPMO45Code2WavBatchError {strict_error_json(reject)}"
