"""Strict policy (S1-S11): the upstream Code2Wav `_parse_item` + `decode_batch`."""

from __future__ import annotations

from codeclog.consumers.stream.fold.checks import chunk_window, content_problem, reject_chunk
from codeclog.consumers.stream.fold.outcomes import (
    Marker,
    Outcome,
    Reject,
    RejectReason,
    Release,
    details_of,
    new_decode,
)
from codeclog.consumers.stream.fold.state import FoldState, RequestState
from codeclog.schemas.records import CodecChunk


def strict_chunk(state: FoldState, chunk: CodecChunk) -> list[Outcome]:
    window = chunk_window(chunk)
    reject = _strict_check(state, chunk, window)
    if reject is not None or window is None:
        return die(state, reject or reject_chunk(chunk, RejectReason.INVALID_FRAME_COUNT))
    if not window:
        return _strict_empty(state, chunk)
    lookahead = state.lookahead_frames
    if not chunk.last_chunk and len(window) <= lookahead:  # S10
        detail = details_of(frames=len(window), minimum=lookahead + 1)
        return die(state, reject_chunk(chunk, RejectReason.CHUNK_BELOW_LOOKAHEAD_WINDOW, detail))
    rid, epoch = chunk.request_id, chunk.cache_epoch
    seqs = (chunk.chunk_seq,)
    decode = new_decode(rid, epoch, seqs, chunk.last_chunk, window, chunk)  # S11
    if chunk.last_chunk:
        state.open.pop(rid, None)
        return [decode, Release(rid, epoch)]
    _strict_advance(state, chunk)
    return [decode]


def _strict_check(
    state: FoldState, chunk: CodecChunk, window: tuple[int, ...] | None
) -> Reject | None:
    if not chunk.request_id:  # S1
        return reject_chunk(chunk, RejectReason.MISSING_REQUEST_ID)
    if chunk.cache_epoch < 0 or chunk.chunk_seq < 0:  # S2
        return reject_chunk(chunk, RejectReason.NEGATIVE_STREAM_POSITION)
    problem = content_problem(chunk, window)
    if problem is not None:  # S2a: the upstream would fail inside the vocoder backend
        message = ", ".join(f"{key}={value}" for key, value in problem.details)
        reason = problem.reason.value
        backend = details_of(error_type=reason, error=f"{reason}: {message}")
        return reject_chunk(chunk, RejectReason.BACKEND_UNSUPPORTED_OR_FAILED, backend)
    return _strict_position(state.open.get(chunk.request_id), chunk)


def _strict_position(req: RequestState | None, chunk: CodecChunk) -> Reject | None:
    epoch, seq = chunk.cache_epoch, chunk.chunk_seq
    if req is None:
        if seq == 0:
            return None
        detail = details_of(request_id=chunk.request_id, cache_epoch=epoch, chunk_seq=seq)
        return reject_chunk(chunk, RejectReason.MISSING_STATE_FOR_CHUNK, detail)  # S3
    if epoch < req.epoch:  # S4
        detail = details_of(expected=req.epoch, actual=epoch)
        return reject_chunk(chunk, RejectReason.STALE_CACHE_EPOCH, detail)
    if epoch > req.epoch:  # S5 (seq 0 of a newer epoch starts a fresh stream)
        if seq == 0:
            return None
        detail = details_of(request_id=chunk.request_id, cache_epoch=epoch, chunk_seq=seq)
        return reject_chunk(chunk, RejectReason.NEW_EPOCH_REQUIRES_FIRST_CHUNK, detail)
    if seq != req.last_seq + 1:  # S6
        detail = details_of(expected=req.last_seq + 1, actual=seq)
        return reject_chunk(chunk, RejectReason.STALE_OR_REORDERED_CHUNK, detail)
    return None


def _strict_empty(state: FoldState, chunk: CodecChunk) -> list[Outcome]:
    rid = chunk.request_id
    if chunk.last_chunk:  # S7: terminal sentinel
        state.open.pop(rid, None)
        return [Release(rid, chunk.cache_epoch)]
    if chunk.tts_is_last_chunk:  # S8: segment marker (creates state when there is none)
        _strict_advance(state, chunk)
        return [Marker(rid, chunk.cache_epoch, chunk.chunk_seq)]
    detail = details_of(request_ids=(rid,))  # S9
    return die(state, reject_chunk(chunk, RejectReason.EMPTY_NONFINAL_CHUNK, detail))


def _strict_advance(state: FoldState, chunk: CodecChunk) -> None:
    req = state.open.get(chunk.request_id)
    if req is None:
        req = state.open[chunk.request_id] = RequestState(is_open=True)
    req.epoch = chunk.cache_epoch
    req.last_seq = chunk.chunk_seq


def die(state: FoldState, reject: Reject) -> list[Outcome]:
    """A strict rejection is fatal to the stage: every open stream dies with it."""
    state.fatal = reject
    killed = dict.fromkeys([*state.open, reject.request_id])
    state.killed = tuple(killed)
    return [reject]
