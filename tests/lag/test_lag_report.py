"""Lag reports: building from measurements, JSON without NaN, the table."""

from __future__ import annotations

import dataclasses
import json

from codeclog.lag.arithmetic import GroupMeasurement, PartitionMeasurement
from codeclog.lag.evaluator import (
    EvaluatorConfig,
    GroupRule,
    GroupStatus,
    LagWindows,
    PartitionId,
    PartitionStatus,
    offset_lag,
)
from codeclog.lag.report import (
    GroupReport,
    build_report,
    format_table,
    measured_rules,
    to_dict,
    to_sample,
)

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


def never_committed(at_ms: int) -> GroupMeasurement:
    """The issue's stopped group: partition 0 consumed and committed, partitions 1-3 hold new
    sessions the group never touched; no members left."""
    rows = (
        PartitionMeasurement(0, 12, 0, 12, 0, 0.0, 0.0, False, 12, False),
        PartitionMeasurement(1, None, 0, 4, 4, 118.88, 4.0, False, 0, True),
        PartitionMeasurement(2, None, 0, 4, 4, 2.0, 4.0, False, 0, True),
        PartitionMeasurement(3, None, 0, 3, 3, 1.0, 3.0, False, 0, True),
    )
    return GroupMeasurement("g", "codec.chunks", at_ms, "EMPTY", 0, rows, 4.0)


def one_shot(m: GroupMeasurement) -> GroupReport:
    config = EvaluatorConfig()
    windows = LagWindows(config)
    for row in m.partitions:
        windows.observe(PartitionId(m.topic, row.partition), to_sample(row, m.observed_at_ms))
    sizes = {k: len(windows.window(k)) for k in windows.partitions()}
    rules = measured_rules(m, young=True, config=config)
    return build_report(m, windows.evaluate(m.observed_at_ms), sizes, 0.0, rules)


def test_never_committed_partitions_count_and_say_so() -> None:
    report = one_shot(never_committed(T0_MS))
    assert report.status is GroupStatus.ERR
    assert report.rules == (GroupRule.EMPTY_WITH_LAG,)
    assert report.total_lag == 11 and report.total_audio_lag_s == 11.0
    assert report.max_time_lag_s == 118.88
    assert report.partition(1).status is PartitionStatus.LAGGING
    assert not report.drained
    decoded = json.loads(json.dumps(to_dict(report), allow_nan=False))
    assert decoded["rules"] == ["empty_with_lag"] and decoded["drained"] is False
    assert decoded["exists"] is True
    rows = decoded["partitions"]
    assert [(r["from_reset"], r["start_offset"], r["lag"]) for r in rows] == [
        (False, 12, 0),
        (True, 0, 4),
        (True, 0, 4),
        (True, 0, 3),
    ]
    assert rows[1]["committed_offset"] is None and rows[1]["rule"] == "time_lag_above"


def test_table_marks_lag_from_the_reset_position() -> None:
    lines = format_table(one_shot(never_committed(T0_MS))).splitlines()
    assert lines[1].split() == ["0", "12", "12", "0", "0.00", "0.00", "OK"]
    assert lines[2].split() == ["1", "-", "4", "4*", "118.88", "4.00", "LAGGING"]
    assert lines[5].startswith("* no committed offset: lag measured from the reset position")
    assert lines[6].startswith(
        "group g on codec.chunks: ERR: the group has no members while records wait (state EMPTY"
    )


def test_a_group_the_cluster_does_not_know_is_reported_as_such() -> None:
    rows = (PartitionMeasurement(0, None, 0, 0, 0, 0.0, 0.0, False, 0, True),)
    m = GroupMeasurement("nope", "codec.chunks", T0_MS, "DEAD", 0, rows, 1.0)
    report = one_shot(m)
    assert report.rules == (GroupRule.GROUP_NOT_FOUND,) and not report.exists
    assert report.status is GroupStatus.ERR
    assert to_dict(report)["exists"] is False
    assert "the group does not exist on the cluster" in format_table(report).splitlines()[-1]


def test_drained_needs_every_partition_with_data_committed_to_its_end() -> None:
    committed = (
        PartitionMeasurement(0, 12, 0, 12, 0, 0.0, 0.0, True, 12, False),
        PartitionMeasurement(1, None, 0, 0, 0, 0.0, 0.0, True, 0, True),  # no data: fine
    )
    m = GroupMeasurement("g", "codec.chunks", T0_MS, "STABLE", 1, committed, 1.0)
    assert one_shot(m).drained
    unknown = (*committed, PartitionMeasurement(2, None, None, None, None, None, None, True))
    assert not one_shot(dataclasses.replace(m, partitions=unknown)).drained
