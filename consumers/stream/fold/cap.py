"""Dropping an open stream on purpose: `evict`, and the open-stream cap (rule C1a) built on it."""

from __future__ import annotations

from codeclog.consumers.stream.fold.outcomes import (
    Details,
    Outcome,
    Reject,
    RejectReason,
    details_of,
)
from codeclog.consumers.stream.fold.release import end_stream
from codeclog.consumers.stream.fold.state import FoldState


def mark_active(state: FoldState, request_id: str) -> None:
    """C1a: an event of a request with an open stream makes it the most recently active."""
    req = state.open.pop(request_id, None)
    if req is not None:
        state.open[request_id] = req


def evict_least_active(state: FoldState, opener: str, outcomes: list[Outcome]) -> None:
    """C1a: while more than `max_open` streams are open, evict the least recently active one
    (the first of `open`; never the stream the event just opened, which is the last)."""
    assert state.max_open is not None
    while len(state.open) > state.max_open and state.fatal is None:
        victim = next(iter(state.open))
        why = details_of(evicted_by=opener, max_open_streams=state.max_open)
        outcomes.extend(evict(state, victim, why))


def evict(state: FoldState, request_id: str, details: Details = ()) -> list[Outcome]:
    """Drop a request's open stream on purpose (the cap C1a, or a vocoder failure): reject +
    release. Never fatal, under either policy. A request without an open stream yields no
    outcome. Late chunks of the evicted epoch are then rejected `evicted` (tolerant, rule T3a).
    """
    req = state.open.get(request_id)
    if req is None:
        return []
    reject = Reject(
        request_id,
        RejectReason.EVICTED,
        req.epoch,
        req.last_seq,
        tuple(sorted(details_of(held_frames=len(req.held_codes)) + details)),
    )
    return [reject, end_stream(state, req, request_id, RejectReason.EVICTED)]
