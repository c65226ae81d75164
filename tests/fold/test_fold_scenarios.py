"""Every scenario reproduces its expected report exactly, under both policies.

The keys compared are those of tests/data/scenarios/README.md, "The report" (where the real
report "may carry more keys"); `build_report` produces exactly these, so the whole report is
compared.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codeclog.consumers.stream.fold.report import build_report
from codeclog.consumers.stream.fold.state import FoldConfig, Policy
from codeclog.replay.scenario import read_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "data" / "scenarios"
REPORT_KEYS = {"policy", "events", "unprocessed", "stage", "requests"}
NAMES = sorted(path.stem for path in SCENARIOS.glob("*.jsonl"))


def test_the_scenarios_are_there() -> None:
    assert len(NAMES) >= 6
    assert all((SCENARIOS / f"{name}.expected.json").is_file() for name in NAMES)


@pytest.mark.parametrize("policy", list(Policy), ids=[p.value for p in Policy])
@pytest.mark.parametrize("name", NAMES)
def test_scenario_report(name: str, policy: Policy) -> None:
    events = read_scenario(SCENARIOS / f"{name}.jsonl")
    expected = json.loads((SCENARIOS / f"{name}.expected.json").read_text())[policy.value]
    report = build_report(events, FoldConfig(policy=policy))
    assert set(report) == REPORT_KEYS
    assert {key: report[key] for key in REPORT_KEYS} == {key: expected[key] for key in REPORT_KEYS}
    # the report is JSON as the replay tool prints it
    assert json.loads(json.dumps(report)) == report
