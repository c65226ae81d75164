"""The fold's rules for one event, `fold(state, event) -> (state, outcomes)`: the checks, the strict
and tolerant policies side by side, apply, release, control events and the cap (C1a). Each branch
names its rule in docs/fold-contract.md, which holds the reasons, the costs and the contract."""

from __future__ import annotations

from codeclog.consumers.stream.fold.outcomes import (
    Abandoned,
    Decode,
    Details,
    Duplicate,
    Echo,
    Gap,
    Hold,
    Marker,
    Outcome,
    Reject,
    RejectReason,
    Release,
    details_of,
)
from codeclog.consumers.stream.fold.state import (
    MAX_POSITION,
    NO_DIGESTS,
    NO_POSITION,
    Digests,
    FoldState,
    RequestState,
    Tombstone,
)
from codeclog.schemas.records import (
    CodecChunk,
    ControlEvent,
    ControlKind,
    first_invalid_code,
    slot_constructor,
)

Event = CodecChunk | ControlEvent


def fold(state: FoldState, event: Event) -> tuple[FoldState, list[Outcome]]:
    """Apply one event. Returns the same (mutated) state object and the event's outcomes."""
    if state.fatal is not None:
        state.unprocessed += 1
        return state, []
    state.events += 1
    if state.max_open is None:
        return state, _dispatch(state, event)
    opened = len(state.open)
    mark_active(state, event.request_id)
    outcomes = _dispatch(state, event)
    if len(state.open) > opened:  # C1a: a stream opened; evict beyond the cap
        evict_least_active(state, event.request_id, outcomes)
    return state, outcomes


def _dispatch(state: FoldState, event: Event) -> list[Outcome]:
    if type(event) is CodecChunk:
        if state.strict:
            return strict_chunk(state, event)
        return tolerant_chunk(state, event)
    if type(event) is ControlEvent:
        return control(state, event)
    raise TypeError(f"fold takes CodecChunk or ControlEvent, got {type(event).__name__}")


# -- checks both policies share (S1/T1, S2/T2, S2a/T2a), and a chunk's digest ----------------------


def chunk_window(chunk: CodecChunk) -> tuple[int, ...] | None:
    """`codes[:code_flat_numel]` (numel defaults to len(codes)); None when numel is out of range."""
    codes = chunk.codes
    numel = chunk.code_flat_numel
    if numel is None or numel == len(codes):
        return codes  # the common case: no copy
    if 0 <= numel < len(codes):
        return codes[:numel]
    return None


def content_problem(chunk: CodecChunk, window: tuple[int, ...] | None) -> Reject | None:
    """T2a/S2a: the real ids must exist and be codec ids; checked before any state is read."""
    if window is None:
        detail = details_of(code_flat_numel=chunk.code_flat_numel, codes=len(chunk.codes))
        return reject_chunk(chunk, RejectReason.INVALID_FRAME_COUNT, detail)
    index = first_invalid_code(window)
    if index is None:
        return None
    detail = details_of(index=index, code=window[index])
    return reject_chunk(chunk, RejectReason.INVALID_CODES, detail)


def reject_chunk(chunk: CodecChunk, reason: RejectReason, details: Details = ()) -> Reject:
    return Reject(chunk.request_id, reason, chunk.cache_epoch, chunk.chunk_seq, details)


def chunk_digest(chunk: CodecChunk, window: tuple[int, ...]) -> int:
    """Equal digests mean a true replay. Only ints and bools: hash() is stable across runs."""
    return hash((window, len(window), chunk.last_chunk, chunk.tts_is_last_chunk))


# -- strict policy (S1-S11): the upstream Code2Wav `_parse_item` + `decode_batch` ------------------


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


# -- tolerant policy (T1-T8) and applying an accepted chunk (A1-A4) --------------------------------


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


# -- the decode a rule builds (the fold's hot path) ------------------------------------------------


_CONSTRUCT_DECODE = slot_constructor(Decode)


def new_decode(
    request_id: str,
    cache_epoch: int,
    chunk_seqs: tuple[int, ...],
    final: bool,
    codes: tuple[int, ...],
    newest: CodecChunk | None,
    held: Echo | None = None,
) -> Decode:
    """`Decode(...)` with `frames=len(codes)`, several times faster (the fold's hot path):
    records.slot_constructor fills the slots without the frozen __init__'s per-field
    object.__setattr__. A test checks that both build equal objects."""
    decode: Decode = _CONSTRUCT_DECODE(
        request_id, cache_epoch, chunk_seqs, len(codes), final, codes, newest, held
    )
    return decode


# -- ending an open stream: decode its held frames, release it, keep its tombstone -----------------


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


# -- control events: `finish` decodes what is held and releases the stream, `abort` drops it -------


def control(state: FoldState, event: ControlEvent) -> list[Outcome]:
    rid = event.request_id
    if not rid:
        reject = Reject(rid, RejectReason.MISSING_REQUEST_ID, NO_POSITION, NO_POSITION)
        return die(state, reject) if state.strict else [reject]
    req = state.open.get(rid)
    if req is None:  # nothing open: a repeated or late control event is a no-op
        return []
    if event.kind is ControlKind.FINISH:
        out: list[Outcome] = [flush_held(req, rid, None)] if req.held_codes else []
        out.append(end_stream(state, req, rid, RejectReason.CHUNK_AFTER_FINAL))
        return out
    if event.kind is ControlKind.ABORT:
        return [end_stream(state, req, rid, RejectReason.ABORTED)]
    return []


# -- dropping an open stream on purpose: `evict`, and the open-stream cap (C1a) built on it --------


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
