"""The order of overlapping transactions (consumers/commit_order.py), without Kafka: examples
of the contract, then hypothesis over every order of begins, commit requests, commits,
failures and rewinds."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from codeclog.consumers.commit_order import CommitOrder, OrderError, Verdict


def test_the_second_step_commits_only_after_the_first() -> None:
    order = CommitOrder()
    first, second = order.begin(), order.begin()
    assert (order.slot(first), order.slot(second)) == (0, 1)
    assert order.request_commit(first) and order.request_commit(second)
    assert order.verdict(second) is None  # waits for the first
    assert order.verdict(first) is Verdict.COMMIT
    with pytest.raises(OrderError):
        order.committed(second)
    assert order.committed(first)
    assert order.verdict(second) is Verdict.COMMIT
    assert order.committed(second)
    assert order.in_flight == ()


def test_a_third_step_waits_for_a_free_producer() -> None:
    order = CommitOrder()
    first, _ = order.begin(), order.begin()
    assert not order.can_begin()
    with pytest.raises(OrderError):
        order.begin()
    order.request_commit(first)
    order.committed(first)
    third = order.begin()
    assert order.slot(third) == order.slot(first)


def test_a_failure_aborts_the_later_step_and_nothing_begins_until_rewound() -> None:
    order = CommitOrder()
    first, second = order.begin(), order.begin()
    order.request_commit(first)
    assert order.failed(first) == [first, second]
    assert not order.request_commit(second)  # still being built when the first failed
    assert order.verdict(second) is Verdict.ABORT
    assert not order.can_begin()
    with pytest.raises(OrderError):
        order.begin()
    order.rewound()
    assert order.slot(order.begin()) == 0


def test_a_later_failure_leaves_the_earlier_step_to_commit() -> None:
    order = CommitOrder()
    first, second = order.begin(), order.begin()
    order.request_commit(first)
    assert order.failed(second) == [second]
    with pytest.raises(OrderError):
        order.rewound()  # the first is still in flight
    assert order.committed(first)
    order.rewound()


def test_a_commit_given_up_on_no_longer_counts() -> None:
    order = CommitOrder()
    step = order.begin()
    order.request_commit(step)
    order.failed(step)  # abandoned as stuck
    order.rewound()
    assert order.verdict(step) is Verdict.ABORT
    assert not order.committed(step)  # its late success is not this order's business


class Overlap(RuleBasedStateMachine):
    """Random event orders; the model: which steps were in flight when each began."""

    @initialize()
    def start(self) -> None:
        self.order = CommitOrder()
        self.companions: dict[int, set[int]] = {}  # step -> steps in flight at its begin
        self.outcome: dict[int, str] = {}
        self.commits: list[int] = []
        self.requested: set[int] = set()

    @precondition(lambda self: self.order.can_begin())
    @rule()
    def begin(self) -> None:
        before = set(self.order.in_flight)
        step = self.order.begin()
        assert step not in self.companions
        self.companions[step] = before
        assert self.order.slot(step) not in {self.order.slot(s) for s in before}

    @rule(data=st.data())
    def request(self, data: st.DataObject) -> None:
        waiting = [s for s in self.companions if s not in self.requested]
        if not waiting:
            return
        step = data.draw(st.sampled_from(waiting))
        self.requested.add(step)
        accepted = self.order.request_commit(step)
        assert accepted == (self.outcome.get(step) != "aborted")

    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        ready = [
            s
            for s in self.order.in_flight
            if s in self.requested and self.order.verdict(s) is Verdict.COMMIT
        ]
        if not ready:
            return
        step = data.draw(st.sampled_from(ready))
        assert self.order.committed(step)
        # exactly once: every step in flight with it when it began has committed
        assert all(self.outcome.get(s) == "committed" for s in self.companions[step])
        self.outcome[step] = "committed"
        self.commits.append(step)

    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        if not self.order.in_flight:
            return
        step = data.draw(st.sampled_from(self.order.in_flight))
        later = [s for s in self.order.in_flight if s >= step]
        assert self.order.failed(step) == later
        for s in later:
            self.outcome[s] = "aborted"
            if s in self.requested:
                assert self.order.verdict(s) is Verdict.ABORT

    @precondition(lambda self: self.order.failed_pending and not self.order.in_flight)
    @rule()
    def rewind(self) -> None:
        self.order.rewound()

    @invariant()
    def bounded_and_ordered(self) -> None:
        assert len(self.order.in_flight) <= 2
        assert self.commits == sorted(self.commits)
        assert list(self.order.in_flight) == sorted(self.order.in_flight)
        for step in self.order.in_flight:
            assert step not in self.outcome  # unresolved
            if step in self.requested:
                waits_for_earlier = step != self.order.in_flight[0]
                assert (self.order.verdict(step) is None) == waits_for_earlier


Overlap.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_overlap_order = Overlap.TestCase
