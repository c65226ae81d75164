"""The fold: per-request codec-stream state, `fold(state, event) -> (state, outcomes)`.

The rules (S* strict, T* tolerant, A* apply, control events) are in docs/fold-contract.md; each
branch below names the rule it implements. No I/O, clock, randomness, torch, Kafka or Avro.

Performance contract: `fold` mutates `state` in place and returns the same object, so a caller
must not keep an older reference expecting it to be a snapshot (use `export_request` for that).
Only the event's own request record is touched (at the LRU bound below, the least recently
used tombstone is also dropped).

Memory, measured with tracemalloc (CPython 3.11, 64-bit; tests/fold/test_fold_memory.py keeps
it honest), not counting the request id string the state keeps as a key:
- tolerant, open request: about 560 bytes + 12 bytes per applied chunk, the digests of at most
  `digest_ring` (256) chunks: 0.9 KB for a 30-chunk turn, at most about 3.7 KB, whatever the
  stream's length;
- tolerant, request without an open stream: about 450 bytes + one tombstone per released epoch
  it keeps (`released_epochs_kept`, 2): 1.2 KB after one 30-chunk epoch, 1.9 KB after several,
  at most about 7.5 KB (two 256-chunk tombstones). These requests live in an LRU of
  `tombstone_requests` (100_000): about 0.12 GB for 100_000 one-turn requests, 0.75 GB worst;
- strict: about 300 bytes per open request, nothing after release.
Bound the number of open requests in the caller (`open_requests`, `evict`).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import enum
import itertools
from array import array
from typing import Any

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
    new_decode,
)
from codeclog.errors import CodeclogError
from codeclog.schemas.records import (
    CodecChunk,
    ControlEvent,
    ControlKind,
    first_invalid_code,
)

# The wire's Avro `int`: a larger cache_epoch / chunk_seq can only come from hand-written input.
MAX_POSITION = 2**31 - 1
NO_POSITION = -1  # cache_epoch / chunk_seq of a reject that has none (a control event)

Event = CodecChunk | ControlEvent


class Policy(enum.Enum):
    STRICT = "strict"  # mirror of the upstream Code2Wav: the first rejection kills the stage
    TOLERANT = "tolerant"  # the product default: a bad event costs at most its own request


class FoldError(CodeclogError):
    """Base of the fold's errors (the fold itself never raises on event values)."""


class FoldConfigError(FoldError):
    """A FoldConfig value is out of range."""


class FoldStateError(FoldError):
    """An exported request state cannot be imported (malformed or inconsistent)."""


@dataclasses.dataclass(frozen=True, slots=True)
class FoldConfig:
    """The fold's knobs. Every bound on memory is here."""

    policy: Policy = Policy.TOLERANT
    lookahead_frames: int = 3  # L: a non-final window needs at least L+1 frames (Token2wav: 3)
    tombstone_requests: int = 100_000  # LRU size of requests without an open stream
    digest_ring: int = 256  # digests kept per epoch (the newest applied chunks)
    released_epochs_kept: int = 2  # tombstones kept per request (its newest released epochs)
    # C1a: at most this many open streams in one fold state (None: no cap); opening one more
    # evicts the least recently active. The consumer sets it per input partition.
    max_open_streams: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.policy, Policy):
            raise FoldConfigError(f"policy must be a Policy, got {self.policy!r}")
        _require_int("lookahead_frames", self.lookahead_frames, 0)
        _require_int("tombstone_requests", self.tombstone_requests, 1)
        _require_int("digest_ring", self.digest_ring, 1)
        _require_int("released_epochs_kept", self.released_epochs_kept, 1)
        if self.max_open_streams is not None:
            _require_int("max_open_streams", self.max_open_streams, 1)


def _require_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise FoldConfigError(f"FoldConfig.{name} must be an int >= {minimum}, got {value!r}")


@dataclasses.dataclass(slots=True, eq=False)
class _Digests:
    """Digests of the newest applied chunks of one epoch, by chunk_seq (strictly increasing).

    Two flat arrays keep it at 12 bytes a chunk. `forgotten_below` is one past the newest seq
    that fell out of the ring: a redelivery below it cannot be verified (classified duplicate).
    """

    seqs: array[int] = dataclasses.field(default_factory=lambda: array("i"))
    values: array[int] = dataclasses.field(default_factory=lambda: array("q"))
    forgotten_below: int = 0

    def forget_oldest(self) -> None:
        self.forgotten_below = self.seqs[0] + 1
        del self.seqs[0]
        del self.values[0]

    def get(self, seq: int) -> int | None:
        index = bisect.bisect_left(self.seqs, seq)
        if index < len(self.seqs) and self.seqs[index] == seq:
            return self.values[index]
        return None


_NO_DIGESTS = _Digests()  # the digests of a request without an open stream (read-only)


@dataclasses.dataclass(frozen=True, slots=True)
class _Tombstone:
    """What remains of a released epoch: enough to tell a redelivery from a late chunk."""

    last_seq: int
    digests: _Digests
    end: RejectReason  # reason for a non-duplicate late chunk: chunk_after_final/aborted/evicted


@dataclasses.dataclass(slots=True, eq=False)
class _Request:
    """Everything the fold knows about one request id. Mutated in place by the fold."""

    epoch: int = NO_POSITION  # the newest epoch seen (open or released)
    is_open: bool = False  # the stream of `epoch` is open
    last_seq: int = NO_POSITION  # last applied chunk_seq of the open stream
    held_codes: list[int] = dataclasses.field(default_factory=list)  # tolerant only
    held_seqs: list[int] = dataclasses.field(default_factory=list)
    held_echo: Echo | None = None
    digests: _Digests = _NO_DIGESTS  # tolerant, open streams only: set by T5
    released: dict[int, _Tombstone] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True, eq=False)
class FoldState:
    """The whole fold state. Treat as opaque; read it through the functions of this module."""

    config: FoldConfig
    strict: bool  # copies of config values read on every event (one attribute load, not two)
    lookahead_frames: int
    digest_ring: int
    max_open: int | None  # C1a's cap; with it, `open` is kept least recently active first
    open: dict[str, _Request] = dataclasses.field(default_factory=dict)
    closed: collections.OrderedDict[str, _Request] = dataclasses.field(
        default_factory=collections.OrderedDict
    )  # tolerant: requests without an open stream, least recently used first
    fatal: Reject | None = None  # strict: the rejection that killed the stage
    killed: tuple[str, ...] = ()  # strict: requests open at the fatal rejection, and its own
    events: int = 0  # events processed (the fatal one included)
    unprocessed: int = 0  # strict: events that arrived after the fatal rejection


def new_state(config: FoldConfig | None = None) -> FoldState:
    config = config or FoldConfig()
    strict = config.policy is Policy.STRICT
    return FoldState(
        config, strict, config.lookahead_frames, config.digest_ring, config.max_open_streams
    )


def fold(state: FoldState, event: Event) -> tuple[FoldState, list[Outcome]]:
    """Apply one event. Returns the same (mutated) state object and the event's outcomes."""
    if state.fatal is not None:
        state.unprocessed += 1
        return state, []
    state.events += 1
    if state.max_open is None:
        return state, _dispatch(state, event)
    opened = len(state.open)
    _mark_active(state, event.request_id)
    outcomes = _dispatch(state, event)
    if len(state.open) > opened:  # C1a: a stream opened; evict beyond the cap
        _evict_least_active(state, event.request_id, outcomes)
    return state, outcomes


def _dispatch(state: FoldState, event: Event) -> list[Outcome]:
    if type(event) is CodecChunk:
        if state.strict:
            return _strict_chunk(state, event)
        return _tolerant_chunk(state, event)
    if type(event) is ControlEvent:
        return _control(state, event)
    raise TypeError(f"fold takes CodecChunk or ControlEvent, got {type(event).__name__}")


def _mark_active(state: FoldState, request_id: str) -> None:
    """C1a: an event of a request with an open stream makes it the most recently active."""
    req = state.open.pop(request_id, None)
    if req is not None:
        state.open[request_id] = req


def _evict_least_active(state: FoldState, opener: str, outcomes: list[Outcome]) -> None:
    """C1a: while more than `max_open` streams are open, evict the least recently active one
    (the first of `open`; never the stream the event just opened, which is the last)."""
    assert state.max_open is not None
    while len(state.open) > state.max_open and state.fatal is None:
        victim = next(iter(state.open))
        why = details_of(evicted_by=opener, max_open_streams=state.max_open)
        outcomes.extend(evict(state, victim, why))


def open_requests(state: FoldState) -> list[str]:
    """Request ids with an open stream: with a cap (C1a), least recently active first; without,
    in the order their record was created or reopened."""
    return list(state.open)


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
    return [reject, _end(state, req, request_id, RejectReason.EVICTED)]


# ---------------------------------------------------------------------------------------------
# Checks shared by both policies (S1/T1, S2/T2, S2a/T2a)


def _window(chunk: CodecChunk) -> tuple[int, ...] | None:
    """`codes[:code_flat_numel]` (numel defaults to len(codes)); None when numel is out of range."""
    codes = chunk.codes
    numel = chunk.code_flat_numel
    if numel is None or numel == len(codes):
        return codes  # the common case: no copy
    if 0 <= numel < len(codes):
        return codes[:numel]
    return None


def _content_problem(chunk: CodecChunk, window: tuple[int, ...] | None) -> Reject | None:
    """T2a/S2a: the real ids must exist and be codec ids; checked before any state is read."""
    if window is None:
        detail = details_of(code_flat_numel=chunk.code_flat_numel, codes=len(chunk.codes))
        return _reject(chunk, RejectReason.INVALID_FRAME_COUNT, detail)
    index = first_invalid_code(window)
    if index is None:
        return None
    return _reject(chunk, RejectReason.INVALID_CODES, details_of(index=index, code=window[index]))


def _reject(chunk: CodecChunk, reason: RejectReason, details: Details = ()) -> Reject:
    return Reject(chunk.request_id, reason, chunk.cache_epoch, chunk.chunk_seq, details)


def _digest(chunk: CodecChunk, window: tuple[int, ...]) -> int:
    """Equal digests mean a true replay. Only ints and bools: hash() is stable across runs."""
    return hash((window, len(window), chunk.last_chunk, chunk.tts_is_last_chunk))


# ---------------------------------------------------------------------------------------------
# Strict policy (S1-S11): the upstream Code2Wav `_parse_item` + `decode_batch`


def _strict_chunk(state: FoldState, chunk: CodecChunk) -> list[Outcome]:
    window = _window(chunk)
    reject = _strict_check(state, chunk, window)
    if reject is not None or window is None:
        return _die(state, reject or _reject(chunk, RejectReason.INVALID_FRAME_COUNT))
    if not window:
        return _strict_empty(state, chunk)
    lookahead = state.lookahead_frames
    if not chunk.last_chunk and len(window) <= lookahead:  # S10
        detail = details_of(frames=len(window), minimum=lookahead + 1)
        return _die(state, _reject(chunk, RejectReason.CHUNK_BELOW_LOOKAHEAD_WINDOW, detail))
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
        return _reject(chunk, RejectReason.MISSING_REQUEST_ID)
    if chunk.cache_epoch < 0 or chunk.chunk_seq < 0:  # S2
        return _reject(chunk, RejectReason.NEGATIVE_STREAM_POSITION)
    problem = _content_problem(chunk, window)
    if problem is not None:  # S2a: the upstream would fail inside the vocoder backend
        message = ", ".join(f"{key}={value}" for key, value in problem.details)
        reason = problem.reason.value
        backend = details_of(error_type=reason, error=f"{reason}: {message}")
        return _reject(chunk, RejectReason.BACKEND_UNSUPPORTED_OR_FAILED, backend)
    return _strict_position(state.open.get(chunk.request_id), chunk)


def _strict_position(req: _Request | None, chunk: CodecChunk) -> Reject | None:
    epoch, seq = chunk.cache_epoch, chunk.chunk_seq
    if req is None:
        if seq == 0:
            return None
        detail = details_of(request_id=chunk.request_id, cache_epoch=epoch, chunk_seq=seq)
        return _reject(chunk, RejectReason.MISSING_STATE_FOR_CHUNK, detail)  # S3
    if epoch < req.epoch:  # S4
        detail = details_of(expected=req.epoch, actual=epoch)
        return _reject(chunk, RejectReason.STALE_CACHE_EPOCH, detail)
    if epoch > req.epoch:  # S5 (seq 0 of a newer epoch starts a fresh stream)
        if seq == 0:
            return None
        detail = details_of(request_id=chunk.request_id, cache_epoch=epoch, chunk_seq=seq)
        return _reject(chunk, RejectReason.NEW_EPOCH_REQUIRES_FIRST_CHUNK, detail)
    if seq != req.last_seq + 1:  # S6
        detail = details_of(expected=req.last_seq + 1, actual=seq)
        return _reject(chunk, RejectReason.STALE_OR_REORDERED_CHUNK, detail)
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
    return _die(state, _reject(chunk, RejectReason.EMPTY_NONFINAL_CHUNK, detail))


def _strict_advance(state: FoldState, chunk: CodecChunk) -> None:
    req = state.open.get(chunk.request_id)
    if req is None:
        req = state.open[chunk.request_id] = _Request(is_open=True)
    req.epoch = chunk.cache_epoch
    req.last_seq = chunk.chunk_seq


def _die(state: FoldState, reject: Reject) -> list[Outcome]:
    """A strict rejection is fatal to the stage: every open stream dies with it."""
    state.fatal = reject
    killed = dict.fromkeys([*state.open, reject.request_id])
    state.killed = tuple(killed)
    return [reject]


# ---------------------------------------------------------------------------------------------
# Tolerant policy (T1-T8, A1-A4)


def _tolerant_chunk(state: FoldState, chunk: CodecChunk) -> list[Outcome]:
    rid = chunk.request_id
    epoch, seq = chunk.cache_epoch, chunk.chunk_seq
    if not rid or epoch < 0 or seq < 0 or epoch > MAX_POSITION or seq > MAX_POSITION:
        return [_bad_identity(chunk)]  # T1, T2
    codes, numel = chunk.codes, chunk.code_flat_numel
    if numel is None or numel == len(codes):  # _window(), inlined: this is the hot path
        window: tuple[int, ...] | None = codes
    else:
        window = codes[:numel] if 0 <= numel < len(codes) else None
    # T2a before any state is read
    if window is None or first_invalid_code(window) is not None:
        return [_content_problem(chunk, window) or _reject(chunk, RejectReason.INVALID_CODES)]
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
        return _reject(chunk, RejectReason.MISSING_REQUEST_ID)
    if chunk.cache_epoch < 0 or chunk.chunk_seq < 0:  # T2
        return _reject(chunk, RejectReason.NEGATIVE_STREAM_POSITION)
    limit = details_of(maximum=MAX_POSITION)  # T2: the wire cannot carry it
    return _reject(chunk, RejectReason.STREAM_POSITION_OUT_OF_RANGE, limit)


def _same_epoch(
    state: FoldState, req: _Request, chunk: CodecChunk, window: tuple[int, ...]
) -> list[Outcome]:
    seq = chunk.chunk_seq
    if seq <= req.last_seq:  # T6
        return [_redelivery(req.digests, chunk, window, RejectReason.CONFLICTING_DUPLICATE)]
    gap = Gap(chunk.request_id, req.epoch, req.last_seq + 1, seq - 1, len(req.held_codes))
    _drop_held(req)  # T7: continuity is broken
    return _apply(state, req, chunk, window, [gap])


def _redelivery(
    digests: _Digests, chunk: CodecChunk, window: tuple[int, ...], conflict: RejectReason
) -> Outcome:
    """T3/T6: a position already passed. Same digest: duplicate; else `conflict` (or late)."""
    seq = chunk.chunk_seq
    applied = digests.get(seq)
    if applied is None and seq < digests.forgotten_below:  # too old to verify: trust it
        return Duplicate(chunk.request_id, chunk.cache_epoch, seq)
    if applied == _digest(chunk, window):
        return Duplicate(chunk.request_id, chunk.cache_epoch, seq)
    if conflict is not RejectReason.CONFLICTING_DUPLICATE:  # T3: the epoch is over
        return _reject(chunk, conflict, details_of(cache_epoch=chunk.cache_epoch))
    if applied is None:  # T6a: this position was declared missing by a gap
        return _reject(chunk, RejectReason.LATE_CHUNK, details_of(chunk_seq=seq))
    return _reject(chunk, conflict, details_of(chunk_seq=seq))


def _old_epoch(
    state: FoldState, req: _Request, chunk: CodecChunk, window: tuple[int, ...]
) -> list[Outcome]:
    if not req.is_open:
        state.closed.move_to_end(chunk.request_id)
    tombstone = req.released.get(chunk.cache_epoch)
    if tombstone is not None:  # T3 (T3a: the reason depends on how the epoch ended)
        if chunk.chunk_seq > tombstone.last_seq:
            return [_reject(chunk, tombstone.end, details_of(cache_epoch=chunk.cache_epoch))]
        return [_redelivery(tombstone.digests, chunk, window, tombstone.end)]
    detail = details_of(expected=req.epoch, actual=chunk.cache_epoch)
    return [_reject(chunk, RejectReason.STALE_CACHE_EPOCH, detail)]  # T4


def _new_epoch(
    state: FoldState, req: _Request | None, chunk: CodecChunk, window: tuple[int, ...]
) -> list[Outcome]:
    """T5: a fresh stream at this epoch; the previous one, if open, is dropped."""
    rid = chunk.request_id
    out: list[Outcome] = []
    if req is None:
        req = _Request()
    elif req.is_open:
        if req.held_codes:
            out.append(Abandoned(rid, req.epoch, len(req.held_codes)))
            _drop_held(req)
    else:
        del state.closed[rid]
    state.open[rid] = req
    req.epoch = chunk.cache_epoch
    req.is_open = True
    req.last_seq = NO_POSITION
    req.digests = _Digests()
    if chunk.chunk_seq > 0:
        out.append(Gap(rid, req.epoch, 0, chunk.chunk_seq - 1, 0))
    return _apply(state, req, chunk, window, out)


def _apply(
    state: FoldState, req: _Request, chunk: CodecChunk, window: tuple[int, ...], out: list[Outcome]
) -> list[Outcome]:
    """A1-A4. The position is recorded first, whatever the chunk turns out to be (the P2 rule)."""
    seq = chunk.chunk_seq
    req.last_seq = seq
    digests = req.digests
    digests.seqs.append(seq)
    digests.values.append(hash((window, len(window), chunk.last_chunk, chunk.tts_is_last_chunk)))
    if len(digests.seqs) > state.digest_ring:
        digests.forget_oldest()
    if req.held_codes:
        return _apply_held(state, req, chunk, window, out)
    if not window:
        return _apply_empty(state, req, chunk, out)
    last = chunk.last_chunk
    if last or len(window) > state.lookahead_frames:  # A4, the hot path: decode it alone
        rid = chunk.request_id
        out.append(new_decode(rid, req.epoch, (seq,), last, window, chunk))
        if last:
            out.append(_end(state, req, rid, RejectReason.CHUNK_AFTER_FINAL))
        return out
    req.held_codes = list(window)  # A4: a short non-final window waits for the next one
    req.held_seqs = [seq]
    req.held_echo = Echo.of(chunk)
    out.append(Hold(chunk.request_id, req.epoch, seq, len(window)))
    return out


def _apply_held(
    state: FoldState, req: _Request, chunk: CodecChunk, window: tuple[int, ...], out: list[Outcome]
) -> list[Outcome]:
    """A1-A4 with frames held: merge them with this chunk, minus its repeated left context."""
    rid = chunk.request_id
    if not window:
        return _apply_empty(state, req, chunk, out)
    drop = min(max(chunk.codec_left_context_frames, 0), len(window))
    req.held_codes.extend(window[drop:])
    req.held_seqs.append(chunk.chunk_seq)
    if chunk.last_chunk:
        out.append(_flush(req, rid, chunk))
        out.append(_end(state, req, rid, RejectReason.CHUNK_AFTER_FINAL))
    elif len(req.held_codes) > state.lookahead_frames:
        out.append(_flush(req, rid, chunk, final=False))
    else:
        req.held_echo = (req.held_echo or Echo()).then(Echo.of(chunk))
        out.append(Hold(rid, req.epoch, chunk.chunk_seq, len(req.held_codes)))
    return out


def _apply_empty(
    state: FoldState, req: _Request, chunk: CodecChunk, out: list[Outcome]
) -> list[Outcome]:
    """A1-A3: a chunk without codec ids (a placeholder or a terminal sentinel)."""
    rid = chunk.request_id
    if chunk.last_chunk:  # A1
        if req.held_codes:
            out.append(_flush(req, rid, chunk))
        out.append(_end(state, req, rid, RejectReason.CHUNK_AFTER_FINAL))
    elif chunk.tts_is_last_chunk:  # A2: held frames stay held
        out.append(Marker(rid, req.epoch, chunk.chunk_seq))
    else:  # A3: the position still advances
        out.append(_reject(chunk, RejectReason.EMPTY_NONFINAL_CHUNK))
    return out


def _flush(req: _Request, rid: str, newest: CodecChunk | None, final: bool = True) -> Decode:
    """Decode the held frames (and the chunk merged into them, `newest`) as one window."""
    codes = tuple(req.held_codes)
    seqs = tuple(req.held_seqs)
    decode = new_decode(rid, req.epoch, seqs, final, codes, newest, req.held_echo)
    _drop_held(req)
    return decode


def _drop_held(req: _Request) -> None:
    req.held_codes = []
    req.held_seqs = []
    req.held_echo = None


def _end(state: FoldState, req: _Request, rid: str, end: RejectReason) -> Release:
    """Close the open stream: release it and keep a tombstone (tolerant) or nothing (strict)."""
    release = Release(rid, req.epoch)
    if state.strict:
        del state.open[rid]
        return release
    _drop_held(req)
    req.released[req.epoch] = _Tombstone(req.last_seq, req.digests, end)
    if len(req.released) > state.config.released_epochs_kept:
        del req.released[next(iter(req.released))]  # epochs only grow: the first is the oldest
    req.is_open = False
    req.digests = _NO_DIGESTS  # shared and never written: T5 gives a reopened stream its own
    del state.open[rid]
    state.closed[rid] = req
    if len(state.closed) > state.config.tombstone_requests:
        state.closed.popitem(last=False)
    return release


# ---------------------------------------------------------------------------------------------
# Control events


def _control(state: FoldState, event: ControlEvent) -> list[Outcome]:
    rid = event.request_id
    if not rid:
        reject = Reject(rid, RejectReason.MISSING_REQUEST_ID, NO_POSITION, NO_POSITION)
        return _die(state, reject) if state.strict else [reject]
    req = state.open.get(rid)
    if req is None:  # nothing open: a repeated or late control event is a no-op
        return []
    if event.kind is ControlKind.FINISH:
        out: list[Outcome] = [_flush(req, rid, None)] if req.held_codes else []
        out.append(_end(state, req, rid, RejectReason.CHUNK_AFTER_FINAL))
        return out
    if event.kind is ControlKind.ABORT:
        return [_end(state, req, rid, RejectReason.ABORTED)]
    return []


# ---------------------------------------------------------------------------------------------
# Snapshot / restore of one request (plain JSON-able dicts)

EXPORT_VERSION = 1


def export_request(state: FoldState, request_id: str) -> dict[str, Any] | None:
    """One request's fold state as a JSON-able dict, or None when the fold knows nothing of it."""
    req = state.open.get(request_id) or state.closed.get(request_id)
    if req is None:
        return None
    return {
        "version": EXPORT_VERSION,
        "epoch": req.epoch,
        "open": req.is_open,
        "last_seq": req.last_seq,
        "held_codes": list(req.held_codes),
        "held_seqs": list(req.held_seqs),
        "held_echo": None if req.held_echo is None else _export_echo(req.held_echo),
        "digests": _export_digests(req.digests),
        "released": [
            {"epoch": epoch, "last_seq": t.last_seq, "end": t.end.value}
            | {"digests": _export_digests(t.digests)}
            for epoch, t in req.released.items()
        ],
    }


def _export_digests(digests: _Digests) -> dict[str, Any]:
    return {
        "seqs": list(digests.seqs),
        "values": list(digests.values),
        "forgotten_below": digests.forgotten_below,
    }


def _export_echo(echo: Echo) -> dict[str, Any]:
    fields = dataclasses.asdict(echo)
    fields["llm_output_text_utf8"] = echo.llm_output_text_utf8.hex()
    return fields


def import_request(state: FoldState, request_id: str, data: dict[str, Any]) -> None:
    """Replace a request's fold state with an `export_request` dict. Raises FoldStateError."""
    if not request_id:
        raise FoldStateError("cannot import a request state without a request id")
    try:
        req = _import(data)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise FoldStateError(f"malformed state for request {request_id!r}: {exc}") from exc
    state.open.pop(request_id, None)
    state.closed.pop(request_id, None)
    if req.is_open:
        state.open[request_id] = req
        return
    state.closed[request_id] = req
    if len(state.closed) > state.config.tombstone_requests:
        state.closed.popitem(last=False)


def _import(data: dict[str, Any]) -> _Request:
    if data.get("version") != EXPORT_VERSION:
        raise ValueError(f"unknown version {data.get('version')!r}")
    req = _Request(
        epoch=_int(data["epoch"]),
        is_open=_bool(data["open"]),
        last_seq=_int(data["last_seq"]),
        held_codes=[_int(code) for code in data["held_codes"]],
        held_seqs=[_int(seq) for seq in data["held_seqs"]],
        held_echo=None if data["held_echo"] is None else _import_echo(data["held_echo"]),
        digests=_import_digests(data["digests"]),
    )
    for item in data["released"]:
        end = RejectReason(item["end"])
        tombstone = _Tombstone(_int(item["last_seq"]), _import_digests(item["digests"]), end)
        req.released[_int(item["epoch"])] = tombstone
    _check_consistent(req)
    return req


def _check_consistent(req: _Request) -> None:
    if not req.is_open and req.epoch >= 0 and req.epoch not in req.released:
        raise ValueError("a closed request must have a tombstone for its current epoch")
    if bool(req.held_codes) != bool(req.held_seqs) or (req.held_codes and not req.is_open):
        raise ValueError("held frames need held chunk seqs and an open stream")
    if any(epoch > req.epoch for epoch in req.released):
        raise ValueError("a released epoch is newer than the current epoch")


def _import_digests(data: dict[str, Any]) -> _Digests:
    seqs = array("i", [_int(seq) for seq in data["seqs"]])
    values = array("q", [_int(value) for value in data["values"]])
    if len(seqs) != len(values) or any(a >= b for a, b in itertools.pairwise(seqs)):
        raise ValueError("digest seqs must be strictly increasing and match the values")
    return _Digests(seqs, values, _int(data["forgotten_below"]))


def _import_echo(data: dict[str, Any]) -> Echo:
    return Echo(
        duplex_epoch=_int(data["duplex_epoch"]),
        duplex_turn_id=_int(data["duplex_turn_id"]),
        turn_end=_bool(data["turn_end"]),
        tts_is_last_chunk=_bool(data["tts_is_last_chunk"]),
        segment_end=_bool(data["segment_end"]),
        llm_output_text_utf8=bytes.fromhex(data["llm_output_text_utf8"]),
        produced_at_ms=_int(data["produced_at_ms"]),
    )


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an int, got {value!r}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a bool, got {value!r}")
    return value
