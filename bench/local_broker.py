"""The cluster a benchmark runs against: --bootstrap when given, else a fresh local broker.

with cluster(args.bootstrap) as bootstrap:
    ...
with local_cluster(args.bootstrap) as found:   # also the broker's pid and log dirs, when local
    ...
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Cluster:
    bootstrap: str
    pid: int | None = None  # the broker's JVM, when the benchmark started it
    log_dirs: Path | None = None  # its log directory, likewise


@contextmanager
def local_cluster(bootstrap: str | None) -> Iterator[Cluster]:
    """`bootstrap` itself, or a local broker in a temporary dir, stopped on exit (and when the
    benchmark's process dies: die_with_parent)."""
    if bootstrap:
        yield Cluster(bootstrap)
        return
    from codeclog.devtools.broker import BrokerSettings, LocalBroker

    with tempfile.TemporaryDirectory(prefix="codeclog-bench-") as tmp:
        broker = LocalBroker(Path(tmp), BrokerSettings(die_with_parent=True))
        print("starting a local broker ...", file=sys.stderr)
        state = broker.start(lambda message: print(f"  {message}", file=sys.stderr))
        try:
            yield Cluster(state.bootstrap, state.pid, broker.log_dirs)
        finally:
            broker.stop()


@contextmanager
def cluster(bootstrap: str | None) -> Iterator[str]:
    """The bootstrap address of `local_cluster`."""
    with local_cluster(bootstrap) as found:
        yield found.bootstrap
