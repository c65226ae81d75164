"""Lag reports: building from measurements, JSON without NaN, the table."""

from __future__ import annotations

import json

from lag.evaluator import (
    EvaluatorConfig,
    GroupStatus,
    LagWindows,
    PartitionId,
    PartitionStatus,
    offset_lag,
)
from lag.measure import GroupMeasurement, PartitionMeasurement
from lag.report import build_report, format_table, to_dict, to_sample

T0_MS = 1_700_000_000_000


def measurement(at_ms: int, committed: int | None, end: int) -> GroupMeasurement:
    rows = (
        PartitionMeasurement(0, committed, 0, end, offset_lag(committed, end), 1.5, 3.0, False),
        PartitionMeasurement(1, None, 0, 0, None, None, None, False),
    )
    return GroupMeasurement("g", "codec.chunks", at_ms, "EMPTY", 0, rows, 4.0)


def run(steps: list[tuple[int, int | None, int]]) -> list:
    windows = LagWindows(EvaluatorConfig(stuck_after_ms=20_000))
    reports = []
    for at_ms, committed, end in steps:
        m = measurement(at_ms, committed, end)
        for row in m.partitions:
            windows.observe(PartitionId(m.topic, row.partition), to_sample(row, at_ms))
        sizes = {k: len(windows.window(k)) for k in windows.partitions()}
        reports.append(build_report(m, windows.evaluate(at_ms), sizes, windows.complete()))
    return reports


def test_report_follows_the_evaluator() -> None:
    reports = run([(T0_MS + i * 10_000, 100, 110 + 10 * i) for i in range(4)])
    first, last = reports[0], reports[-1]
    assert first.status is GroupStatus.OK
    assert last.partition(0).status is PartitionStatus.STOP
    assert last.status is GroupStatus.ERR
    assert last.total_lag == 40 and last.max_lag == 40
    assert last.partition(1).lag is None
    assert last.partition(0).samples == 4


def test_json_has_null_not_nan() -> None:
    report = run([(T0_MS, 100, 130)])[0]
    text = json.dumps(to_dict(report), allow_nan=False)
    decoded = json.loads(text)
    assert decoded["status"] == "OK"
    assert decoded["partitions"][1]["lag"] is None
    assert decoded["partitions"][0]["rule"] == "not_growing"


def test_table_marks_unknown_with_dash() -> None:
    report = run([(T0_MS, 100, 130)])[0]
    lines = format_table(report).splitlines()
    assert lines[0].split() == [
        "partition",
        "committed",
        "LSO",
        "lag",
        "time",
        "lag",
        "s",
        "audio",
        "lag",
        "s",
        "status",
    ]
    assert lines[1].split() == ["0", "100", "130", "30", "1.50", "3.00", "OK"]
    assert lines[2].split() == ["1", "-", "0", "-", "-", "-", "OK"]
    assert lines[3].startswith("group g on codec.chunks: OK (state EMPTY, 0 members, total lag 30")
