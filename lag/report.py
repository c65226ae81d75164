"""Lag reports: measurements joined with the evaluator's verdicts, as values, JSON and a table.

Pure: no Kafka, no clock. Unknown values stay None (JSON null, "-" in the table), never NaN.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from codeclog.lag.arithmetic import GroupMeasurement, PartitionMeasurement
from codeclog.lag.evaluator import (
    EvaluatorConfig,
    GroupRule,
    GroupStatus,
    PartitionId,
    PartitionStatus,
    Rule,
    Sample,
    Verdict,
    group_rules,
    group_status,
)


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionReport:
    """One partition: what was measured and what the evaluator concluded."""

    topic: str
    partition: int
    committed_offset: int | None
    earliest_offset: int | None
    end_offset: int | None  # last stable offset
    lag: int | None  # records, end_offset - start_offset clamped at 0
    time_lag_s: float | None
    audio_lag_s: float | None
    owned: bool | None
    status: PartitionStatus
    rule: Rule
    idle_ms: int | None  # time since the committed offset last changed, as far as the window sees
    samples: int  # samples in the partition's window
    start_offset: int | None = None  # where the lag is measured from (committed, else reset)
    from_reset: bool = False  # no committed offset: measured from the reset position


@dataclasses.dataclass(frozen=True, slots=True)
class GroupReport:
    """A group on one topic at one instant."""

    group: str
    topic: str
    observed_at_ms: int
    status: GroupStatus
    state: str | None  # consumer group state (STABLE, EMPTY, DEAD, ...); None: unknown
    member_count: int | None
    partitions: tuple[PartitionReport, ...]
    poll_time_ms: float
    complete: float  # fraction of partitions with a full window (Burrow)
    rules: tuple[GroupRule, ...] = ()  # group rules that hold (lag.evaluator); any: ERR

    @property
    def exists(self) -> bool:
        """False when the cluster does not know the group at all."""
        return GroupRule.GROUP_NOT_FOUND not in self.rules

    @property
    def drained(self) -> bool:
        """Every partition with data committed to its end.

        A partition the group never committed on counts with its lag from the reset position,
        so one that holds records is not drained; an unknown lag is not drained either.
        """
        return all(p.lag == 0 for p in self.partitions)

    @property
    def total_lag(self) -> int | None:
        known = [p.lag for p in self.partitions if p.lag is not None]
        return sum(known) if known else None

    @property
    def max_lag(self) -> int | None:
        return _max(p.lag for p in self.partitions)

    @property
    def max_time_lag_s(self) -> float | None:
        return _max(p.time_lag_s for p in self.partitions)

    @property
    def total_audio_lag_s(self) -> float | None:
        known = [p.audio_lag_s for p in self.partitions if p.audio_lag_s is not None]
        return sum(known) if known else None

    def partition(self, number: int) -> PartitionReport:
        for report in self.partitions:
            if report.partition == number:
                return report
        raise KeyError(number)


def _max(values: Any) -> Any:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def measured_rules(
    measurement: GroupMeasurement, young: bool, config: EvaluatorConfig
) -> tuple[GroupRule, ...]:
    """The group rules for a measurement (its latest sample of every partition)."""
    samples = [to_sample(m, measurement.observed_at_ms) for m in measurement.partitions]
    return group_rules(measurement.state, measurement.member_count, samples, young, config)


def to_sample(measured: PartitionMeasurement, observed_at_ms: int) -> Sample:
    return Sample(
        observed_at_ms=observed_at_ms,
        committed_offset=measured.committed_offset,
        end_offset=measured.end_offset,
        lag=measured.lag,
        time_lag_s=measured.time_lag_s,
        audio_lag_s=measured.audio_lag_s,
        owned=measured.owned,
    )


def build_report(
    measurement: GroupMeasurement,
    verdicts: Mapping[PartitionId, Verdict],
    window_sizes: Mapping[PartitionId, int],
    complete: float,
    rules: tuple[GroupRule, ...] = (),
) -> GroupReport:
    rows = tuple(
        _partition_report(measurement.topic, m, verdicts, window_sizes)
        for m in measurement.partitions
    )
    return GroupReport(
        group=measurement.group,
        topic=measurement.topic,
        observed_at_ms=measurement.observed_at_ms,
        status=group_status((r.status for r in rows), rules),
        state=measurement.state,
        member_count=measurement.member_count,
        partitions=rows,
        poll_time_ms=measurement.poll_time_ms,
        complete=complete,
        rules=rules,
    )


def _partition_report(
    topic: str,
    m: PartitionMeasurement,
    verdicts: Mapping[PartitionId, Verdict],
    window_sizes: Mapping[PartitionId, int],
) -> PartitionReport:
    key = PartitionId(topic, m.partition)
    verdict = verdicts.get(key, Verdict(PartitionStatus.OK, Rule.NO_DATA, None))
    return PartitionReport(
        topic=topic,
        **dataclasses.asdict(m),  # the row is the measurement as measured, then the verdict
        status=verdict.status,
        rule=verdict.rule,
        idle_ms=verdict.idle_ms,
        samples=window_sizes.get(key, 0),
    )


def to_dict(report: GroupReport) -> dict[str, Any]:
    """The report as JSON-ready values: enums as their string values, None as null."""
    return {
        "group": report.group,
        "topic": report.topic,
        "observed_at_ms": report.observed_at_ms,
        "status": report.status.value,
        "rules": [rule.value for rule in report.rules],
        "exists": report.exists,
        "drained": report.drained,
        "state": report.state,
        "member_count": report.member_count,
        "total_lag": report.total_lag,
        "max_lag": report.max_lag,
        "max_time_lag_s": report.max_time_lag_s,
        "total_audio_lag_s": report.total_audio_lag_s,
        "poll_time_ms": round(report.poll_time_ms, 3),
        "complete": report.complete,
        "partitions": [_partition_dict(p) for p in report.partitions],
    }


def _partition_dict(p: PartitionReport) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in dataclasses.fields(p):
        value = getattr(p, field.name)
        out[field.name] = value.value if isinstance(value, PartitionStatus | Rule) else value
    return out


_COLUMNS = ("partition", "committed", "LSO", "lag", "time lag s", "audio lag s", "status")


def _cell(value: int | float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


FROM_RESET_MARK = "*"
RULE_TEXT: Mapping[GroupRule, str] = {
    GroupRule.GROUP_NOT_FOUND: "the group does not exist on the cluster (no members, no offsets)",
    GroupRule.EMPTY_WITH_LAG: "the group has no members while records wait",
    GroupRule.NEVER_COMMITTED: "the group has never committed while its topic has data",
}


def _row(p: PartitionReport) -> tuple[str, ...]:
    lag = _cell(p.lag) + (FROM_RESET_MARK if p.from_reset and p.lag is not None else "")
    values = (p.partition, p.committed_offset, p.end_offset)
    return (
        *(_cell(v) for v in values),
        lag,
        _cell(p.time_lag_s),
        _cell(p.audio_lag_s),
        p.status.value,
    )


def format_table(report: GroupReport) -> str:
    """A fixed-width table, one row per partition, a note on lags measured from the reset
    position, then the group status line."""
    rows = [_COLUMNS, *(_row(p) for p in report.partitions)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    if any(p.from_reset and p.lag is not None for p in report.partitions):
        lines.append(
            f"{FROM_RESET_MARK} no committed offset: lag measured from the reset position "
            "(auto.offset.reset; earliest = the log start offset)"
        )
    return "\n".join([*lines, status_line(report)])


def status_line(report: GroupReport) -> str:
    members = "?" if report.member_count is None else str(report.member_count)
    rules = "; ".join(RULE_TEXT[rule] for rule in report.rules)
    rules = f": {rules}" if rules else ""
    return (
        f"group {report.group} on {report.topic}: {report.status.value}{rules} "
        f"(state {report.state or '?'}, {members} members, total lag {_cell(report.total_lag)}, "
        f"max time lag {_cell(report.max_time_lag_s)} s, "
        f"audio lag {_cell(report.total_audio_lag_s)} s, window {report.complete:.0%} full)"
    )
