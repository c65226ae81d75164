"""Consumer-lag measurement, evaluation and alerting.

Modules: `lag.evaluator` (pure Burrow-style rules over a window of samples), `lag.measure`
(offsets, LSO, time lag and audio lag from the cluster) with `lag.arithmetic` (the lag, time
lag and audio lag of a partition, no Kafka) and `lag.readers` (committed offsets and head
reads), `lag.report` (reports, JSON, table), `lag.monitor` (`LagMonitor`: measure + evaluate),
`lag.exporter` (Prometheus metrics).

`from lag import LagMonitor, GroupReport` works without importing Kafka for users of the pure
evaluator: the two names are resolved on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from codeclog.lag.monitor import LagMonitor
    from codeclog.lag.report import GroupReport

__all__ = ["GroupReport", "LagMonitor"]


def __getattr__(name: str) -> Any:
    if name == "LagMonitor":
        from codeclog.lag.monitor import LagMonitor

        return LagMonitor
    if name == "GroupReport":
        from codeclog.lag.report import GroupReport

        return GroupReport
    raise AttributeError(f"module 'lag' has no attribute {name!r}")
