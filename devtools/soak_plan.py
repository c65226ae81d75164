"""When the soak (`python -m bench.soak`) injects which fault: a plan drawn from the seed.

Fault k comes at (k + 1/2) x `every_s`, moved by up to a quarter of `every_s` either way, for
as long as FAULT_ROOM_S (the longest faults, the whole cluster down and its cold start, or a
minute of slow links, are over within it) and then a cool-down of COOL_DOWN_SHARE of the run
still fit before the end. The cool-down is there because the verdict judges drift, not
recovery: what a fault holds for minutes (a call stuck inside librdkafka for 2-5 minutes
after a whole-cluster `down`, with its handle's 13 fds and 7 threads; the group's lag while it
catches up) is released in it, so the fit's last samples and the last quarter's lag see the
group again in its steady state, and what a fault leaves behind for good still shows. The
faults are drawn from a shuffled bag: every fault once before any comes again, so an hour at
one fault every 3.5 minutes (the default) injects each of the matrix's 14 faults once (14-15
faults, the last about 50 minutes in).
"""

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
    """The faults of a run of `duration_s`, one about every `every_s` (module docstring)."""
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
