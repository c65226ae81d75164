"""Tolerant policy (T1-T8) and applying an accepted chunk (A1-A4)."""

from __future__ import annotations

from codeclog.consumers.stream.fold.checks import chunk_digest, content_problem, reject_chunk
from codeclog.consumers.stream.fold.outcomes import (
    Abandoned,
    Duplicate,
    Echo,
    Gap,
    Hold,
    Marker,
    Outcome,
    Reject,
    RejectReason,
    details_of,
    new_decode,
)
from codeclog.consumers.stream.fold.release import drop_held, end_stream, flush_held
from codeclog.consumers.stream.fold.state import (
    MAX_POSITION,
    NO_POSITION,
    Digests,
    FoldState,
    RequestState,
)
from codeclog.schemas.records import CodecChunk, first_invalid_code


def tolerant_chunk(state: FoldState, chunk: CodecChunk) -> list[Outcome]:
    rid = chunk.request_id
    epoch, seq = chunk.cache_epoch, chunk.chunk_seq
    if not rid or epoch < 0 or seq < 0 or epoch > MAX_POSITION or seq > MAX_POSITION:
        return [_bad_identity(chunk)]  # T1, T2
    codes, numel = chunk.codes, chunk.code_flat_numel
    if numel is None or numel == len(codes):  # chunk_window(), inlined: this is the hot path
        window: tuple[int, ...] | None = codes
    else:
        window = codes[:numel] if 0 <= numel < len(codes) else None
    # T2a before any state is read
    if window is None or first_invalid_code(window) is not None:
        return [content_problem(chunk, window) or reject_chunk(chunk, RejectReason.INVALID_CODES)]
    req = state.open.get(rid)
    if req is not None and epoch == req.epoch:
        if seq == req.last_seq + 1:  # T8, the hot path
            return _apply(state, req, chunk, window, [])
        return _same_epoch(state, req, chunk, window)
    if req is None:
        req = state.closed.get(rid)
    if req is None or epoch > req.epoch:
        return _new_epoch(state, req, chunk, window)
    return _old_epoch(state, req, chunk, window)


def _bad_identity(chunk: CodecChunk) -> Reject:
    if not chunk.request_id:  # T1
        return reject_chunk(chunk, RejectReason.MISSING_REQUEST_ID)
    if chunk.cache_epoch < 0 or chunk.chunk_seq < 0:  # T2
        return reject_chunk(chunk, RejectReason.NEGATIVE_STREAM_POSITION)
    limit = details_of(maximum=MAX_POSITION)  # T2: the wire cannot carry it
    return reject_chunk(chunk, RejectReason.STREAM_POSITION_OUT_OF_RANGE, limit)


def _same_epoch(
    state: FoldState, req: RequestState, chunk: CodecChunk, window: tuple[int, ...]
) -> list[Outcome]:
    seq = chunk.chunk_seq
    if seq <= req.last_seq:  # T6
        return [_redelivery(req.digests, chunk, window, RejectReason.CONFLICTING_DUPLICATE)]
    gap = Gap(chunk.request_id, req.epoch, req.last_seq + 1, seq - 1, len(req.held_codes))
    drop_held(req)  # T7: continuity is broken
    return _apply(state, req, chunk, window, [gap])


def _redelivery(
    digests: Digests, chunk: CodecChunk, window: tuple[int, ...], conflict: RejectReason
) -> Outcome:
    """T3/T6: a position already passed. Same digest: duplicate; else `conflict` (or late)."""
    seq = chunk.chunk_seq
    applied = digests.get(seq)
    if applied is None and seq < digests.forgotten_below:  # too old to verify: trust it
        return Duplicate(chunk.request_id, chunk.cache_epoch, seq)
    if applied == chunk_digest(chunk, window):
        return Duplicate(chunk.request_id, chunk.cache_epoch, seq)
    if conflict is not RejectReason.CONFLICTING_DUPLICATE:  # T3: the epoch is over
        return reject_chunk(chunk, conflict, details_of(cache_epoch=chunk.cache_epoch))
    if applied is None:  # T6a: this position was declared missing by a gap
        return reject_chunk(chunk, RejectReason.LATE_CHUNK, details_of(chunk_seq=seq))
    return reject_chunk(chunk, conflict, details_of(chunk_seq=seq))


def _old_epoch(
    state: FoldState, req: RequestState, chunk: CodecChunk, window: tuple[int, ...]
) -> list[Outcome]:
    if not req.is_open:
        state.closed.move_to_end(chunk.request_id)
    tombstone = req.released.get(chunk.cache_epoch)
    if tombstone is not None:  # T3 (T3a: the reason depends on how the epoch ended)
        if chunk.chunk_seq > tombstone.last_seq:
            return [reject_chunk(chunk, tombstone.end, details_of(cache_epoch=chunk.cache_epoch))]
        return [_redelivery(tombstone.digests, chunk, window, tombstone.end)]
    detail = details_of(expected=req.epoch, actual=chunk.cache_epoch)
    return [reject_chunk(chunk, RejectReason.STALE_CACHE_EPOCH, detail)]  # T4


def _new_epoch(
    state: FoldState, req: RequestState | None, chunk: CodecChunk, window: tuple[int, ...]
) -> list[Outcome]:
    """T5: a fresh stream at this epoch; the previous one, if open, is dropped."""
    rid = chunk.request_id
    out: list[Outcome] = []
    if req is None:
        req = RequestState()
    elif req.is_open:
        if req.held_codes:
            out.append(Abandoned(rid, req.epoch, len(req.held_codes)))
            drop_held(req)
    else:
        del state.closed[rid]
    state.open[rid] = req
    req.epoch = chunk.cache_epoch
    req.is_open = True
    req.last_seq = NO_POSITION
    req.digests = Digests()
    if chunk.chunk_seq > 0:
        out.append(Gap(rid, req.epoch, 0, chunk.chunk_seq - 1, 0))
    return _apply(state, req, chunk, window, out)


def _apply(
    state: FoldState,
    req: RequestState,
    chunk: CodecChunk,
    window: tuple[int, ...],
    out: list[Outcome],
) -> list[Outcome]:
    """A1-A4. The position is recorded first, whatever the chunk turns out to be (the P2 rule)."""
    seq = chunk.chunk_seq
    req.last_seq = seq
    digests = req.digests
    digests.seqs.append(seq)
    digests.values.append(hash((window, len(window), chunk.last_chunk, chunk.tts_is_last_chunk)))
    if len(digests.seqs) > state.digest_ring:
        digests.forget_oldest()
    if not window:
        return _apply_empty(state, req, chunk, out)
    if req.held_codes:
        out += _merge_held(state, req, chunk, window)
        return out
    last = chunk.last_chunk
    if last or len(window) > state.lookahead_frames:  # A4, the hot path: decode it alone
        rid = chunk.request_id
        out.append(new_decode(rid, req.epoch, (seq,), last, window, chunk))
        if last:
            out.append(end_stream(state, req, rid, RejectReason.CHUNK_AFTER_FINAL))
        return out
    req.held_codes = list(window)  # A4: a short non-final window waits for the next one
    req.held_seqs = [seq]
    req.held_echo = Echo.of(chunk)
    out.append(Hold(chunk.request_id, req.epoch, seq, len(window)))
    return out


def _merge_held(
    state: FoldState, req: RequestState, chunk: CodecChunk, window: tuple[int, ...]
) -> list[Outcome]:
    """A4 with frames held: this chunk's ids, minus its repeated left context, join them; the
    merged window is decoded when it is final or long enough, else held further."""
    rid = chunk.request_id
    drop = min(max(chunk.codec_left_context_frames, 0), len(window))
    req.held_codes.extend(window[drop:])
    req.held_seqs.append(chunk.chunk_seq)
    if chunk.last_chunk:
        flushed = flush_held(req, rid, chunk)
        return [flushed, end_stream(state, req, rid, RejectReason.CHUNK_AFTER_FINAL)]
    if len(req.held_codes) > state.lookahead_frames:
        return [flush_held(req, rid, chunk, final=False)]
    req.held_echo = (req.held_echo or Echo()).then(Echo.of(chunk))
    return [Hold(rid, req.epoch, chunk.chunk_seq, len(req.held_codes))]


def _apply_empty(
    state: FoldState, req: RequestState, chunk: CodecChunk, out: list[Outcome]
) -> list[Outcome]:
    """A1-A3: a chunk without codec ids (a placeholder or a terminal sentinel)."""
    rid = chunk.request_id
    if chunk.last_chunk:  # A1
        if req.held_codes:
            out.append(flush_held(req, rid, chunk))
        out.append(end_stream(state, req, rid, RejectReason.CHUNK_AFTER_FINAL))
    elif chunk.tts_is_last_chunk:  # A2: held frames stay held
        out.append(Marker(rid, req.epoch, chunk.chunk_seq))
    else:  # A3: the position still advances
        out.append(reject_chunk(chunk, RejectReason.EMPTY_NONFINAL_CHUNK))
    return out
