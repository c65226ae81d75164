"""'Drained': every partition with data committed to its end.

What `verify`, the demo and the benchmarks wait for before they read the outputs. Not
`codeclog lag --check` OK: that is a health verdict (a consumer a few records behind is
healthy, not finished). A partition the group never committed on counts with its lag from the
reset position (lag.measure), so one that holds records is not drained, and an unknown lag is
not drained either; a partition without data needs no commit. The lag is the records a
read_committed consumer still has to read, so a group whose committed offset points at a
trailing transaction marker is drained.
"""

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
