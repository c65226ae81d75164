"""The Prometheus mapping of lag reports: names, labels, absent-not-NaN, one-hot statuses."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from codeclog.lag.evaluator import GroupRule, GroupStatus, PartitionStatus, Rule
from codeclog.lag.exporter import HELP, LagCollector, report_series
from codeclog.lag.report import GroupReport, PartitionReport


def partition(number: int, **changes: object) -> PartitionReport:
    values: dict[str, object] = {
        "topic": "codec.chunks",
        "partition": number,
        "committed_offset": 100,
        "earliest_offset": 0,
        "end_offset": 130,
        "lag": 30,
        "time_lag_s": 2.5,
        "audio_lag_s": 30.0,
        "owned": True,
        "status": PartitionStatus.OK,
        "rule": Rule.NOT_GROWING,
        "idle_ms": 0,
        "samples": 3,
    }
    values.update(changes)
    return PartitionReport(**values)  # type: ignore[arg-type]


def report(
    group: str,
    *partitions: PartitionReport,
    members: int | None = 1,
    rules: tuple[GroupRule, ...] = (),
) -> GroupReport:
    return GroupReport(
        group=group,
        topic="codec.chunks",
        observed_at_ms=1_700_000_000_000,
        status=GroupStatus.OK,
        state="STABLE",
        member_count=members,
        partitions=partitions,
        poll_time_ms=12.5,
        complete=0.5,
        rules=rules,
    )


def values_of(series: list, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {s.labels: s.value for s in series if s.name == name}


def test_unknown_values_are_absent_never_nan() -> None:
    unknown = partition(
        1,
        committed_offset=None,
        lag=None,
        time_lag_s=None,
        audio_lag_s=None,
        rule=Rule.NO_DATA,
    )
    series = report_series("c", [report("g", unknown, members=None)])
    names = {s.name for s in series}
    for absent in (
        "kafka_consumergroup_group_offset",
        "kafka_consumergroup_group_lag",
        "kafka_consumergroup_group_lag_seconds",
        "codeclog_audio_lag_seconds",
        "kafka_consumergroup_group_sum_lag",
        "kafka_consumergroup_group_max_lag",
        "codeclog_group_members",
    ):
        assert absent not in names
    assert all(not math.isnan(s.value) for s in series)
    assert "kafka_partition_latest_offset" in names  # what is known is still exported


def test_partition_status_is_one_hot() -> None:
    series = report_series("c", [report("g", partition(0, status=PartitionStatus.STALL))])
    status = {
        dict(k)["status"]: v for k, v in values_of(series, "codeclog_partition_status").items()
    }
    assert status == {
        "OK": 0.0,
        "WARN": 0.0,
        "STOP": 0.0,
        "STALL": 1.0,
        "REWIND": 0.0,
        "LAGGING": 0.0,
    }
    group = {dict(k)["status"]: v for k, v in values_of(series, "codeclog_group_status").items()}
    assert group == {"OK": 1.0, "WARN": 0.0, "ERR": 0.0}


def test_group_aggregates() -> None:
    series = report_series(
        "c",
        [report("g", partition(0, lag=30, time_lag_s=1.0), partition(1, lag=70, time_lag_s=4.0))],
    )
    group_labels = (("cluster_name", "c"), ("group", "g"))
    assert values_of(series, "kafka_consumergroup_group_sum_lag") == {group_labels: 100.0}
    assert values_of(series, "kafka_consumergroup_group_max_lag") == {group_labels: 70.0}
    assert values_of(series, "kafka_consumergroup_group_max_lag_seconds") == {group_labels: 4.0}
    assert values_of(series, "kafka_consumergroup_poll_time_ms") == {group_labels: 12.5}


def test_topic_partitions_shared_by_groups_appear_once() -> None:
    series = report_series("c", [report("a", partition(0)), report("b", partition(0))])
    assert len(values_of(series, "kafka_partition_latest_offset")) == 1
    assert len(values_of(series, "kafka_consumergroup_group_lag")) == 2


def test_every_series_has_help() -> None:
    series = report_series("c", [report("g", partition(0), partition(1))])
    assert {s.name for s in series} <= set(HELP)


def scrape(collector: LagCollector) -> dict[str, list]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_collector_exposes_kafka_lag_exporter_names() -> None:
    collector = LagCollector("codeclog")
    collector.update("codeclog-vocoder", report("codeclog-vocoder", partition(0)))
    families = scrape(collector)
    lag = families["kafka_consumergroup_group_lag"]
    assert [(s.labels, s.value) for s in lag] == [
        (
            {
                "cluster_name": "codeclog",
                "group": "codeclog-vocoder",
                "topic": "codec.chunks",
                "partition": "0",
            },
            30.0,
        )
    ]
    assert families["codeclog_lag_measure_failures"][0].value == 0.0


def test_failed_measurement_drops_series_and_counts() -> None:
    collector = LagCollector("codeclog")
    collector.update("g", report("g", partition(0)))
    collector.fail("g")
    families = scrape(collector)
    assert "kafka_consumergroup_group_lag" not in families
    failures = families["codeclog_lag_measure_failures"]
    assert [(s.name, s.value) for s in failures if s.name.endswith("_total")] == [
        ("codeclog_lag_measure_failures_total", 1.0)
    ]


@pytest.mark.parametrize("value", [0, 7, 123456789])
def test_offsets_exported_exactly(value: int) -> None:
    series = report_series("c", [report("g", partition(0, committed_offset=value))])
    assert list(values_of(series, "kafka_consumergroup_group_offset").values()) == [float(value)]


def test_never_committed_partitions_export_their_lag_from_the_reset_position() -> None:
    """Lag, time lag and audio lag of a partition without a committed offset are series, with
    codeclog_partition_lag_from_reset saying where they were measured from; the committed offset
    itself stays absent."""
    fresh = partition(
        2,
        committed_offset=None,
        start_offset=0,
        from_reset=True,
        lag=4,
        time_lag_s=118.88,
        audio_lag_s=4.0,
        status=PartitionStatus.LAGGING,
        rule=Rule.TIME_LAG_ABOVE,
    )
    series = report_series("c", [report("g", partition(0), fresh, members=0)])
    labels = (("cluster_name", "c"), ("group", "g"), ("topic", "codec.chunks"), ("partition", "2"))
    assert values_of(series, "kafka_consumergroup_group_lag")[labels] == 4.0
    assert values_of(series, "kafka_consumergroup_group_lag_seconds")[labels] == 118.88
    assert values_of(series, "codeclog_audio_lag_seconds")[labels] == 4.0
    assert labels not in values_of(series, "kafka_consumergroup_group_offset")
    from_reset = values_of(series, "codeclog_partition_lag_from_reset")
    assert from_reset[labels] == 1.0
    assert from_reset[(*labels[:3], ("partition", "0"))] == 0.0
    group = (("cluster_name", "c"), ("group", "g"))
    assert values_of(series, "kafka_consumergroup_group_sum_lag") == {group: 34.0}


def test_group_rules_are_one_series_each() -> None:
    series = report_series("c", [report("g", partition(0), rules=(GroupRule.EMPTY_WITH_LAG,))])
    rules = {dict(k)["rule"]: v for k, v in values_of(series, "codeclog_group_rule").items()}
    assert rules == {"group_not_found": 0.0, "empty_with_lag": 1.0, "never_committed": 0.0}
