"""Rule C1a, the open-stream cap: beyond `max_open_streams` open streams in one fold state, the
stream that opens one too many evicts the least recently active open stream, as an outcome of
that event. The rule reads nothing but the events, so a member restarted from exported states
(imported in the order of each request's newest event) evicts exactly what an uninterrupted
fold evicts."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.consumers.stream.fold.outcomes import Outcome, Reject, RejectReason, Release
from codeclog.consumers.stream.fold.rules import fold
from codeclog.consumers.stream.fold.state import (
    FoldConfig,
    FoldConfigError,
    FoldState,
    Policy,
    export_request,
    new_state,
    open_requests,
)
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind
from tests.fold.restore import restore

WORDS = (10, 11, 12, 13, 14)  # five frames: decoded alone (A4)


def chunk(rid: str, seq: int, epoch: int = 0, last: bool = False) -> CodecChunk:
    return CodecChunk(
        request_id=rid, cache_epoch=epoch, chunk_seq=seq, codes=WORDS, last_chunk=last
    )


def evictions(outcomes: Sequence[Outcome]) -> list[tuple[str, str]]:
    """(victim, evicting request) of every eviction among the outcomes."""
    return [
        (o.request_id, dict(o.details)["evicted_by"])
        for o in outcomes
        if isinstance(o, Reject) and "evicted_by" in dict(o.details)
    ]


def capped(cap: int, policy: Policy = Policy.TOLERANT) -> FoldState:
    return new_state(FoldConfig(policy=policy, max_open_streams=cap))


def feed(state: FoldState, events: Sequence[CodecChunk | ControlEvent]) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for event in events:
        outcomes.extend(fold(state, event)[1])
    return outcomes


def test_one_stream_too_many_evicts_the_least_recently_active() -> None:
    state = capped(2)
    feed(state, [chunk("a", 0), chunk("b", 0)])
    _, out = fold(state, chunk("c", 0))
    assert evictions(out) == [("a", "c")]
    reject = next(o for o in out if isinstance(o, Reject))
    assert reject.reason is RejectReason.EVICTED
    assert dict(reject.details) == {"evicted_by": "c", "held_frames": 0, "max_open_streams": 2}
    assert Release("a", 0) in out
    assert open_requests(state) == ["b", "c"]


def test_activity_not_opening_order_decides() -> None:
    state = capped(2)
    feed(state, [chunk("a", 0), chunk("b", 0), chunk("a", 1)])  # a spoke after b
    assert evictions(fold(state, chunk("c", 0))[1]) == [("b", "c")]


def test_any_event_of_an_open_stream_counts_as_activity() -> None:
    state = capped(2)
    feed(state, [chunk("a", 0), chunk("b", 0), chunk("a", 0)])  # a redelivery of a's chunk
    assert evictions(fold(state, chunk("c", 0))[1]) == [("b", "c")]


def test_a_stream_reopened_at_a_new_epoch_counts_once() -> None:
    state = capped(2)
    feed(state, [chunk("a", 0), chunk("b", 0)])
    assert evictions(fold(state, chunk("a", 0, epoch=1))[1]) == []  # still two open
    assert open_requests(state) == ["b", "a"]


def test_nothing_is_evicted_below_the_cap_or_without_one() -> None:
    events = [chunk(rid, 0) for rid in "abcdef"]
    assert evictions(feed(capped(6), events)) == []
    assert evictions(feed(new_state(), events)) == []


def test_a_late_chunk_of_an_evicted_stream_is_rejected_evicted() -> None:
    state = capped(1)
    feed(state, [chunk("a", 0), chunk("b", 0)])  # b evicts a
    _, out = fold(state, chunk("a", 1, last=True))
    assert [o.reason for o in out if isinstance(o, Reject)] == [RejectReason.EVICTED]
    assert evictions(out) == []  # rejected: it opened nothing, so it evicts nothing
    assert open_requests(state) == ["b"]


def test_an_evicted_request_is_closed_in_its_export() -> None:
    """What the consumer writes as the victim's closing checkpoint: a restart restores it
    closed, and a late chunk stays rejected `evicted`."""
    state = capped(1)
    feed(state, [chunk("a", 0), chunk("b", 0)])
    exported = export_request(state, "a")
    assert exported is not None and exported["open"] is False
    assert exported["released"][-1]["end"] == RejectReason.EVICTED.value
    _, out = fold(restore(state, ["a"], into=capped(1)), chunk("a", 1))
    assert [o.reason for o in out if isinstance(o, Reject)] == [RejectReason.EVICTED]


def test_strict_evicts_too_and_never_dies_of_it() -> None:
    state = capped(1, Policy.STRICT)
    assert evictions(feed(state, [chunk("a", 0), chunk("b", 0)])) == [("a", "b")]
    assert state.fatal is None


def test_control_events_close_without_evicting() -> None:
    state = capped(1)
    feed(state, [chunk("a", 0), ControlEvent(request_id="a", kind=ControlKind.ABORT)])
    assert evictions(fold(state, chunk("b", 0))[1]) == []


@pytest.mark.parametrize("cap", [0, -1, True, 1.5])
def test_a_cap_below_one_is_refused(cap: object) -> None:
    with pytest.raises(FoldConfigError, match="max_open_streams"):
        FoldConfig(max_open_streams=cap)  # type: ignore[arg-type]


# --- properties ------------------------------------------------------------------------------

# A stream of events over a few requests: (request index, kind); kinds: next chunk, final
# chunk, redelivery of the previous chunk, abort.
steps = st.lists(
    st.tuples(st.integers(0, 7), st.sampled_from(["next", "next", "next", "last", "again"])),
    max_size=80,
)


def script(raw: Sequence[tuple[int, str]]) -> list[CodecChunk | ControlEvent]:
    """Turn raw steps into events: each request counts its seqs; a final chunk ends its epoch,
    the next one opens epoch + 1."""
    seq: dict[str, int] = {}
    epoch: dict[str, int] = {}
    events: list[CodecChunk | ControlEvent] = []
    for index, kind in raw:
        rid = f"r{index}"
        n, e = seq.get(rid, 0), epoch.get(rid, 0)
        if kind == "again" and n > 0:
            events.append(chunk(rid, n - 1, e))
            continue
        events.append(chunk(rid, n, e, last=kind == "last"))
        seq[rid], epoch[rid] = (0, e + 1) if kind == "last" else (n + 1, e)
    return events


def victims_by_model(events: Sequence[CodecChunk | ControlEvent], cap: int) -> list[str]:
    """The rule, restated from its text over the fold's own open/closed verdicts: after an
    event that opened a stream, the open streams whose newest event is oldest go first."""
    state = new_state()  # uncapped: which streams are open is the fold's business
    last_event: dict[str, int] = {}
    evicted: set[str] = set()
    victims: list[str] = []
    for index, event in enumerate(events):
        rid = event.request_id
        was_open = set(open_requests(state)) - evicted
        if rid in evicted and isinstance(event, CodecChunk):
            if event.cache_epoch <= state.closed.get(rid, state.open.get(rid)).epoch:  # type: ignore[union-attr]
                continue  # a late chunk of an evicted epoch: rejected, no state
            evicted.discard(rid)
            state.open.pop(rid, None)
            state.closed.pop(rid, None)
        fold(state, event)
        now_open = set(open_requests(state)) - evicted
        if rid in now_open:
            last_event[rid] = index
        if len(now_open) > len(was_open) and len(now_open) > cap:
            victim = min(now_open - {rid}, key=last_event.__getitem__)
            victims.append(victim)
            evicted.add(victim)
    return victims


@settings(max_examples=200, deadline=None)
@given(raw=steps, cap=st.integers(1, 4))
def test_never_more_than_the_cap_and_the_victim_is_least_recently_active(
    raw: list[tuple[int, str]], cap: int
) -> None:
    events = script(raw)
    state = capped(cap)
    victims: list[str] = []
    for event in events:
        _, out = fold(state, event)
        victims.extend(victim for victim, _ in evictions(out))
        assert len(open_requests(state)) <= cap
    assert victims == victims_by_model(events, cap)


@settings(max_examples=200, deadline=None)
@given(raw=steps, cap=st.integers(1, 4), cut=st.integers(0, 80))
def test_a_restored_fold_evicts_what_an_uninterrupted_one_does(
    raw: list[tuple[int, str]], cap: int, cut: int
) -> None:
    """A member restarted at any event: every request exported, imported in the order of its
    newest event (recovery sorts checkpoints by last_offset), then the rest folded."""
    events = script(raw)
    cut = min(cut, len(events))
    whole = capped(cap)
    expected = [feed(whole, [event]) for event in events]
    before = capped(cap)
    got = [feed(before, [event]) for event in events[:cut]]
    newest = {event.request_id: index for index, event in enumerate(events[:cut])}
    after = restore(before, sorted(newest, key=newest.__getitem__), into=capped(cap))
    got += [feed(after, [event]) for event in events[cut:]]
    assert got == expected
