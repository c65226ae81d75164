"""Prometheus metrics for lag reports, named like kafka-lag-exporter so its dashboards work.
The metrics: docs/lag.md, "The exporter's metrics"."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from codeclog.errors import CodeclogError, UsageError
from codeclog.lag.evaluator import GroupRule, GroupStatus, PartitionStatus
from codeclog.lag.monitor import LagMonitor
from codeclog.lag.readers import MeasureError
from codeclog.lag.report import GroupReport, PartitionReport, status_line

DEFAULT_PORT = 9310
PER_PARTITION = ("cluster_name", "group", "topic", "partition")
PER_GROUP = ("cluster_name", "group")
PER_TOPIC_PARTITION = ("cluster_name", "topic", "partition")

HELP = {
    "kafka_consumergroup_group_offset": "Committed offset of the consumer group per partition.",
    "kafka_consumergroup_group_lag": "Records between the committed offset and the LSO.",
    "kafka_consumergroup_group_lag_seconds": "Age of the record at the committed offset.",
    "codeclog_audio_lag_seconds": "Seconds of codec frames not yet vocoded (estimate).",
    "codeclog_partition_lag_from_reset": (
        "1 when the group has no committed offset and lag is measured from the reset position."
    ),
    "codeclog_partition_status": "1 for the partition's current evaluator status, else 0.",
    "kafka_consumergroup_group_max_lag": "Highest partition lag of the group.",
    "kafka_consumergroup_group_max_lag_seconds": "Highest partition time lag of the group.",
    "kafka_consumergroup_group_sum_lag": "Sum of partition lags of the group.",
    "kafka_consumergroup_group_topic_sum_lag": "Sum of partition lags of the group per topic.",
    "kafka_consumergroup_poll_time_ms": "Milliseconds the last lag measurement took.",
    "codeclog_group_status": "1 for the group's current evaluator status, else 0.",
    "codeclog_group_members": "Live members of the consumer group.",
    "codeclog_group_rule": "1 when the group rule holds (group_not_found, empty_with_lag, ...).",
    "kafka_partition_latest_offset": "Last stable offset of the partition.",
    "kafka_partition_earliest_offset": "Earliest offset of the partition.",
    "codeclog_lag_measure_failures_total": "Lag measurements that failed.",
}


class ExporterError(CodeclogError):
    """The exporter cannot run: prometheus-client missing, or the port cannot be bound."""


class ServeError(ExporterError, UsageError):
    """The metrics port cannot be bound (in use, out of range): a configuration error."""


class MetricsUnavailableError(ExporterError):
    """prometheus-client is not installed."""


@dataclasses.dataclass(frozen=True, slots=True)
class Series:
    """One sample of one metric: plain values, so the mapping is testable without Prometheus."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def _series(name: str, labels: dict[str, str], value: float | None) -> list[Series]:
    if value is None:
        return []  # unknown: absent, never NaN
    return [Series(name, tuple(labels.items()), float(value))]


def partition_series(cluster: str, group: str, p: PartitionReport) -> list[Series]:
    labels = {
        "cluster_name": cluster,
        "group": group,
        "topic": p.topic,
        "partition": str(p.partition),
    }
    out = [
        *_series("kafka_consumergroup_group_offset", labels, p.committed_offset),
        *_series("kafka_consumergroup_group_lag", labels, p.lag),
        *_series("kafka_consumergroup_group_lag_seconds", labels, p.time_lag_s),
        *_series("codeclog_audio_lag_seconds", labels, p.audio_lag_s),
        *_series("codeclog_partition_lag_from_reset", labels, 1.0 if p.from_reset else 0.0),
    ]
    for status in PartitionStatus:
        flag = 1.0 if p.status is status else 0.0
        out += _series("codeclog_partition_status", {**labels, "status": status.value}, flag)
    return out


def group_series(cluster: str, report: GroupReport) -> list[Series]:
    labels = {"cluster_name": cluster, "group": report.group}
    topic_labels = {**labels, "topic": report.topic}
    out = [
        *_series("kafka_consumergroup_group_max_lag", labels, report.max_lag),
        *_series("kafka_consumergroup_group_max_lag_seconds", labels, report.max_time_lag_s),
        *_series("kafka_consumergroup_group_sum_lag", labels, report.total_lag),
        *_series("kafka_consumergroup_group_topic_sum_lag", topic_labels, report.total_lag),
        *_series("kafka_consumergroup_poll_time_ms", labels, report.poll_time_ms),
        *_series("codeclog_group_members", labels, report.member_count),
    ]
    for status in GroupStatus:
        flag = 1.0 if report.status is status else 0.0
        out += _series("codeclog_group_status", {**labels, "status": status.value}, flag)
    for rule in GroupRule:
        holds = 1.0 if rule in report.rules else 0.0
        out += _series("codeclog_group_rule", {**labels, "rule": rule.value}, holds)
    return out


def topic_series(cluster: str, p: PartitionReport) -> list[Series]:
    labels = {"cluster_name": cluster, "topic": p.topic, "partition": str(p.partition)}
    return [
        *_series("kafka_partition_latest_offset", labels, p.end_offset),
        *_series("kafka_partition_earliest_offset", labels, p.earliest_offset),
    ]


def report_series(cluster: str, reports: Sequence[GroupReport]) -> list[Series]:
    """Every series for the given reports; topic partitions shared by groups appear once."""
    out: list[Series] = []
    seen_partitions: set[tuple[str, int]] = set()
    for report in reports:
        out += group_series(cluster, report)
        for p in report.partitions:
            out += partition_series(cluster, report.group, p)
            if (p.topic, p.partition) not in seen_partitions:
                seen_partitions.add((p.topic, p.partition))
                out += topic_series(cluster, p)
    return out


def _prometheus() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core
    except ModuleNotFoundError as exc:
        raise MetricsUnavailableError(
            "prometheus-client is not installed: install the metrics extra "
            "(pip install 'codeclog[metrics]')"
        ) from exc
    return prometheus_client


class LagCollector:
    """A prometheus_client collector over the latest report of each group (thread-safe)."""

    def __init__(self, cluster_name: str) -> None:
        self.cluster_name = cluster_name
        self._lock = threading.Lock()
        self._reports: dict[str, GroupReport] = {}
        self._failures: dict[str, int] = {}

    def update(self, group: str, report: GroupReport) -> None:
        with self._lock:
            self._reports[group] = report
            self._failures.setdefault(group, 0)

    def fail(self, group: str) -> None:
        """A measurement failed: drop the group's series, so staleness is visible as absence."""
        with self._lock:
            self._reports.pop(group, None)
            self._failures[group] = self._failures.get(group, 0) + 1

    def snapshot(self) -> tuple[list[Series], dict[str, int]]:
        with self._lock:
            reports = [self._reports[g] for g in sorted(self._reports)]
            failures = dict(self._failures)
        return report_series(self.cluster_name, reports), failures

    def collect(self) -> Iterator[Any]:
        core = _prometheus().core
        series, failures = self.snapshot()
        families: dict[str, Any] = {}
        for s in series:
            family = families.get(s.name)
            if family is None:
                labels = [k for k, _ in s.labels]
                family = core.GaugeMetricFamily(s.name, HELP[s.name], labels=labels)
                families[s.name] = family
            family.add_metric([v for _, v in s.labels], s.value)
        yield from families.values()
        name = "codeclog_lag_measure_failures"  # prometheus_client appends _total
        counter = core.CounterMetricFamily(name, HELP[name + "_total"], labels=list(PER_GROUP))
        for group in sorted(failures):
            counter.add_metric([self.cluster_name, group], failures[group])
        yield counter


def serve(collector: LagCollector, port: int, address: str) -> int:
    """Serve /metrics in a daemon thread; returns the bound port (useful with port 0)."""
    prometheus = _prometheus()
    registry = prometheus.CollectorRegistry()
    registry.register(collector)
    try:
        server, _thread = prometheus.start_http_server(port, addr=address, registry=registry)
    except (OSError, OverflowError) as exc:  # OverflowError: a port beyond 65535
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise ServeError(f"cannot serve metrics on {address}:{port}: {reason}") from exc
    return int(server.server_port)


def sample_all(
    monitors: Sequence[LagMonitor],
    collector: LagCollector,
    now_ms: int,
    progress: Callable[[str], None],
) -> None:
    """One sampling round: every group measured and evaluated at the same `now_ms`."""
    for monitor in monitors:
        try:
            report = monitor.sample(now_ms)
        except MeasureError as exc:
            collector.fail(monitor.group)
            progress(f"{monitor.group}: measurement failed: {exc}")
            continue
        collector.update(monitor.group, report)
        progress(status_line(report))
