"""Ending a request's open stream: decode its held frames, release it, keep its tombstone."""

from __future__ import annotations

from codeclog.consumers.stream.fold.outcomes import Decode, RejectReason, Release, new_decode
from codeclog.consumers.stream.fold.state import (
    NO_DIGESTS,
    FoldState,
    RequestState,
    Tombstone,
)
from codeclog.schemas.records import CodecChunk


def flush_held(
    req: RequestState, rid: str, newest: CodecChunk | None, final: bool = True
) -> Decode:
    """Decode the held frames (and the chunk merged into them, `newest`) as one window."""
    codes = tuple(req.held_codes)
    seqs = tuple(req.held_seqs)
    decode = new_decode(rid, req.epoch, seqs, final, codes, newest, req.held_echo)
    drop_held(req)
    return decode


def drop_held(req: RequestState) -> None:
    req.held_codes = []
    req.held_seqs = []
    req.held_echo = None


def end_stream(state: FoldState, req: RequestState, rid: str, end: RejectReason) -> Release:
    """Close the open stream: release it and keep a tombstone (tolerant) or nothing (strict)."""
    release = Release(rid, req.epoch)
    if state.strict:
        del state.open[rid]
        return release
    drop_held(req)
    req.released[req.epoch] = Tombstone(req.last_seq, req.digests, end)
    if len(req.released) > state.config.released_epochs_kept:
        del req.released[next(iter(req.released))]  # epochs only grow: the first is the oldest
    req.is_open = False
    req.digests = NO_DIGESTS  # shared and never written: T5 gives a reopened stream its own
    del state.open[rid]
    state.closed[rid] = req
    if len(state.closed) > state.config.tombstone_requests:
        state.closed.popitem(last=False)
    return release
