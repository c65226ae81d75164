"""When the soak (`python -m bench.soak`) injects which fault: a plan drawn from the seed.
Reasons: docs/soak.md, "What runs"."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

FAULT_ROOM_S = 150.0
COOL_DOWN_SHARE = 0.1  # of the run, after the last fault's room: 6 minutes of an hour


@dataclasses.dataclass(frozen=True, slots=True)
class PlannedFault:
    at_s: float  # after the load started
    fault: str


def fault_plan(
    duration_s: float, every_s: float, faults: Sequence[str], rng: random.Random
) -> list[PlannedFault]:
    """The faults of a run of `duration_s`, one about every `every_s`. Fault k comes at
    (k + 1/2) x `every_s`, moved by up to a quarter of `every_s` either way, for as long as
    FAULT_ROOM_S and then a cool-down of COOL_DOWN_SHARE of the run still fit before the end.
    The faults are drawn from a shuffled bag: every fault once before any comes again. Why the
    room and the cool-down: docs/soak.md, "What runs"."""
    if not faults or every_s <= 0:
        return []
    plan: list[PlannedFault] = []
    bag: list[str] = []
    k = 0
    while True:
        at = (k + 0.5) * every_s + rng.uniform(-every_s / 4, every_s / 4)
        if at + FAULT_ROOM_S + COOL_DOWN_SHARE * duration_s > duration_s:
            return plan
        if not bag:
            bag = list(faults)
            rng.shuffle(bag)
        plan.append(PlannedFault(round(at, 1), bag.pop()))
        k += 1
