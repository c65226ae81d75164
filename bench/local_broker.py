"""The cluster a benchmark runs against: --bootstrap when given, else a fresh local broker.

with cluster(args.bootstrap) as bootstrap:
    ...
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def cluster(bootstrap: str | None) -> Iterator[str]:
    """`bootstrap` itself, or a local broker in a temporary dir, stopped on exit (and when the
    benchmark's process dies: die_with_parent)."""
    if bootstrap:
        yield bootstrap
        return
    from codeclog.devtools.broker import BrokerSettings, LocalBroker

    with tempfile.TemporaryDirectory(prefix="codeclog-bench-") as tmp:
        broker = LocalBroker(Path(tmp), BrokerSettings(die_with_parent=True))
        print("starting a local broker ...", file=sys.stderr)
        state = broker.start(lambda message: print(f"  {message}", file=sys.stderr))
        try:
            yield state.bootstrap
        finally:
            broker.stop()
