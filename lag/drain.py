"""'Drained': every partition with data committed to its end. Reasons: docs/lag.md, its last
section."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from codeclog.lag.monitor import LagMonitor
from codeclog.lag.report import GroupReport


def undrained(report: GroupReport) -> list[str]:
    """One phrase per partition that is not committed to its end (empty: drained)."""
    out = []
    for p in report.partitions:
        if p.lag == 0:
            continue
        if p.lag is None:
            out.append(f"partition {p.partition}: lag unknown")
        elif p.from_reset:
            out.append(
                f"partition {p.partition}: never committed, {p.lag} records from the reset position"
            )
        else:
            out.append(
                f"partition {p.partition}: committed {p.committed_offset}, {p.lag} records behind"
            )
    return out


def wait_drained(
    client_config: Mapping[str, str],
    group: str,
    topic: str,
    timeout_s: float,
    *,
    interval_s: float = 0.5,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> GroupReport:
    """Measure until the group is drained or `timeout_s` passed; the last report either way.

    Raises lag.readers.MeasureError when the cluster cannot be asked.
    """
    monitor = LagMonitor(client_config, group, topic)
    try:
        deadline = monotonic() + timeout_s
        while True:
            report = monitor.sample(int(time.time() * 1000))
            if report.drained or monotonic() >= deadline:
                return report
            sleep(interval_s)
    finally:
        monitor.close()
