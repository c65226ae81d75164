"""How many workers a default gives: one per core, within a cap (torch- and Kafka-free)."""

from __future__ import annotations

import os


def one_per_core(cap: int) -> int:
    """One per core of this machine, at least 1 and at most `cap`."""
    return max(1, min(cap, os.cpu_count() or 1))
