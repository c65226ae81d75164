"""When the soak (`python -m bench.soak`) injects which fault: a plan drawn from the seed.

Fault k comes at (k + 1/2) x `every_s`, moved by up to a quarter of `every_s` either way, for
as long as FAULT_ROOM_S still fits before the end (the longest faults, the whole cluster down
and its cold start, or a minute of slow links, are over within it). The faults are drawn from
a shuffled bag: every fault once before any comes again, so an hour at one fault every 4
minutes injects each of the matrix's 14 faults once.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

FAULT_ROOM_S = 150.0


@dataclasses.dataclass(frozen=True, slots=True)
class PlannedFault:
    at_s: float  # after the load started
    fault: str


def fault_plan(
    duration_s: float, every_s: float, faults: Sequence[str], rng: random.Random
) -> list[PlannedFault]:
    """The faults of a run of `duration_s`, one about every `every_s` (module docstring)."""
    if not faults or every_s <= 0:
        return []
    plan: list[PlannedFault] = []
    bag: list[str] = []
    k = 0
    while True:
        at = (k + 0.5) * every_s + rng.uniform(-every_s / 4, every_s / 4)
        if at + FAULT_ROOM_S > duration_s:
            return plan
        if not bag:
            bag = list(faults)
            rng.shuffle(bag)
        plan.append(PlannedFault(round(at, 1), bag.pop()))
        k += 1
