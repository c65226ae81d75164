"""`LagMonitor`: measure one (group, topic) and evaluate it, keeping the window between calls.
Use: docs/lag.md, "The monitor from Python"."""

from __future__ import annotations

from collections.abc import Mapping

from codeclog.lag.evaluator import EvaluatorConfig, LagWindows, PartitionId
from codeclog.lag.measure import LagMeasurer
from codeclog.lag.report import GroupReport, build_report, measured_rules, to_sample


class LagMonitor:
    """Measure + evaluate; the evaluator's window lives as long as the monitor."""

    def __init__(
        self,
        client_config: Mapping[str, str],
        group: str,
        topic: str,
        *,
        config: EvaluatorConfig | None = None,
        measurer: LagMeasurer | None = None,
    ) -> None:
        self.group = group
        self.topic = topic
        self._owns_measurer = measurer is None
        self._measurer = measurer if measurer is not None else LagMeasurer(client_config)
        self._windows = LagWindows(config if config is not None else EvaluatorConfig())
        self._first_sample_ms: int | None = None  # the group is young until stuck_after later

    def sample(self, now_ms: int) -> GroupReport:
        """Measure now, add the sample to each partition's window and evaluate at `now_ms`."""
        measurement = self._measurer.measure(self.group, self.topic, now_ms)
        keys = [PartitionId(self.topic, m.partition) for m in measurement.partitions]
        self._windows.retain(keys)
        for key, measured in zip(keys, measurement.partitions, strict=True):
            self._windows.observe(key, to_sample(measured, now_ms))
        sizes = {key: len(self._windows.window(key)) for key in keys}
        verdicts = self._windows.evaluate(now_ms)
        if self._first_sample_ms is None:
            self._first_sample_ms = now_ms
        config = self._windows.config
        young = now_ms - self._first_sample_ms < config.stuck_after_ms
        rules = measured_rules(measurement, young, config)
        return build_report(measurement, verdicts, sizes, self._windows.complete(), rules)

    def close(self) -> None:
        if self._owns_measurer:
            self._measurer.close()
