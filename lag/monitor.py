"""`LagMonitor`: measure one (group, topic) and evaluate it, keeping the window between calls.

    client = {"bootstrap.servers": "127.0.0.1:9092"}
    monitor = LagMonitor(client, "codeclog-vocoder", "codec.chunks")
    report = monitor.sample(now_ms=int(time.time() * 1000))
    print(report.status, report.total_lag, report.max_time_lag_s)
    monitor.close()

The clock is the caller's: `sample(now_ms)` stamps the measurement and evaluates at `now_ms`,
so tests can drive minutes of window with an injected clock.
"""

from __future__ import annotations

from collections.abc import Mapping

from lag.evaluator import EvaluatorConfig, LagWindows, PartitionId
from lag.measure import LagMeasurer
from lag.report import GroupReport, build_report, to_sample


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

    def sample(self, now_ms: int) -> GroupReport:
        """Measure now, add the sample to each partition's window and evaluate at `now_ms`."""
        measurement = self._measurer.measure(self.group, self.topic, now_ms)
        keys = [PartitionId(self.topic, m.partition) for m in measurement.partitions]
        self._windows.retain(keys)
        for key, measured in zip(keys, measurement.partitions, strict=True):
            self._windows.observe(key, to_sample(measured, now_ms))
        sizes = {key: len(self._windows.window(key)) for key in keys}
        verdicts = self._windows.evaluate(now_ms)
        return build_report(measurement, verdicts, sizes, self._windows.complete())

    def close(self) -> None:
        if self._owns_measurer:
            self._measurer.close()
