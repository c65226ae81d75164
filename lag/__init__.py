"""Consumer-lag measurement, evaluation and alerting (docs/lag.md); its modules: README,
"Architecture"."""

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
