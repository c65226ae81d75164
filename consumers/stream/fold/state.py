"""The fold's state: its config, what it keeps per request id, the whole state, what that costs
in memory (`state_bytes`) and one request's export and import. Opaque outside the fold package;
the measured costs and their reasons: docs/fold-contract.md, "Memory per request"."""

from __future__ import annotations

import bisect
import collections
import dataclasses
import enum
import itertools
from array import array
from typing import Any

from codeclog.consumers.stream.fold.outcomes import Echo, Reject, RejectReason
from codeclog.errors import CodeclogError
from codeclog.json_values import json_bool, json_int

# The wire's Avro `int`: a larger cache_epoch / chunk_seq can only come from hand-written input.
MAX_POSITION = 2**31 - 1
NO_POSITION = -1  # cache_epoch / chunk_seq of a reject that has none (a control event)


class Policy(enum.Enum):
    STRICT = "strict"  # mirror of the upstream Code2Wav: the first rejection kills the stage
    TOLERANT = "tolerant"  # the product default: a bad event costs at most its own request


class FoldError(CodeclogError):
    """Base of the fold's errors (the fold itself never raises on event values)."""


class FoldConfigError(FoldError):
    """A FoldConfig value is out of range."""


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
class Digests:
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


NO_DIGESTS = Digests()  # the digests of a request without an open stream (read-only)


@dataclasses.dataclass(frozen=True, slots=True)
class Tombstone:
    """What remains of a released epoch: enough to tell a redelivery from a late chunk."""

    last_seq: int
    digests: Digests
    end: RejectReason  # reason for a non-duplicate late chunk: chunk_after_final/aborted/evicted


@dataclasses.dataclass(slots=True, eq=False)
class RequestState:
    """Everything the fold knows about one request id. Mutated in place by the fold."""

    epoch: int = NO_POSITION  # the newest epoch seen (open or released)
    is_open: bool = False  # the stream of `epoch` is open
    last_seq: int = NO_POSITION  # last applied chunk_seq of the open stream
    held_codes: list[int] = dataclasses.field(default_factory=list)  # tolerant only
    held_seqs: list[int] = dataclasses.field(default_factory=list)
    held_echo: Echo | None = None
    digests: Digests = NO_DIGESTS  # tolerant, open streams only: set by T5
    released: dict[int, Tombstone] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True, eq=False)
class FoldState:
    """The whole fold state. Treat as opaque; read it through the fold package's functions."""

    config: FoldConfig
    strict: bool  # copies of config values read on every event (one attribute load, not two)
    lookahead_frames: int
    digest_ring: int
    max_open: int | None  # C1a's cap; with it, `open` is kept least recently active first
    open: dict[str, RequestState] = dataclasses.field(default_factory=dict)
    closed: collections.OrderedDict[str, RequestState] = dataclasses.field(
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


def open_requests(state: FoldState) -> list[str]:
    """Request ids with an open stream: with a cap (C1a), least recently active first; without,
    in the order their record was created or reopened."""
    return list(state.open)


# -- what a state holds in memory, estimated from its contents -------------------------------------


OPEN_BYTES = 545
STRICT_OPEN_BYTES = 300  # strict keeps no digests, and nothing once released
CLOSED_BYTES = 460
TOMBSTONE_BYTES = 345
DIGEST_BYTES = 12.5
HELD_FRAME_BYTES = 72
KEY_BYTES = 49  # a str object's size before its characters (ASCII)


def request_bytes(request_id: str, req: RequestState, strict: bool = False) -> int:
    """The estimated bytes one request's state holds (its key included)."""
    size = KEY_BYTES + len(request_id)
    if strict:
        size += STRICT_OPEN_BYTES
    else:
        size += OPEN_BYTES if req.is_open else CLOSED_BYTES
    digests = len(req.digests.seqs) + sum(len(t.digests.seqs) for t in req.released.values())
    size += len(req.released) * TOMBSTONE_BYTES + len(req.held_codes) * HELD_FRAME_BYTES
    return size + round(digests * DIGEST_BYTES)


def state_bytes(state: FoldState) -> int:
    """The estimated bytes of every request a fold state remembers, open or not."""
    total = sum(request_bytes(rid, req, state.strict) for rid, req in state.open.items())
    return total + sum(request_bytes(rid, req) for rid, req in state.closed.items())


def remembered_requests(state: FoldState) -> int:
    """Requests the state remembers: with an open stream, or as tombstones."""
    return len(state.open) + len(state.closed)


# -- export and import of one request's state (plain JSON-able dicts) ------------------------------


EXPORT_VERSION = 1


class FoldStateError(FoldError):
    """An exported request state cannot be imported (malformed or inconsistent)."""


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


def _export_digests(digests: Digests) -> dict[str, Any]:
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


def _import(data: dict[str, Any]) -> RequestState:
    if data.get("version") != EXPORT_VERSION:
        raise ValueError(f"unknown version {data.get('version')!r}")
    req = RequestState(
        epoch=json_int(data["epoch"]),
        is_open=json_bool(data["open"]),
        last_seq=json_int(data["last_seq"]),
        held_codes=[json_int(code) for code in data["held_codes"]],
        held_seqs=[json_int(seq) for seq in data["held_seqs"]],
        held_echo=None if data["held_echo"] is None else _import_echo(data["held_echo"]),
        digests=_import_digests(data["digests"]),
    )
    for item in data["released"]:
        end = RejectReason(item["end"])
        tombstone = Tombstone(json_int(item["last_seq"]), _import_digests(item["digests"]), end)
        req.released[json_int(item["epoch"])] = tombstone
    _check_consistent(req)
    return req


def _check_consistent(req: RequestState) -> None:
    if not req.is_open and req.epoch >= 0 and req.epoch not in req.released:
        raise ValueError("a closed request must have a tombstone for its current epoch")
    if bool(req.held_codes) != bool(req.held_seqs) or (req.held_codes and not req.is_open):
        raise ValueError("held frames need held chunk seqs and an open stream")
    if any(epoch > req.epoch for epoch in req.released):
        raise ValueError("a released epoch is newer than the current epoch")


def _import_digests(data: dict[str, Any]) -> Digests:
    seqs = array("i", [json_int(seq) for seq in data["seqs"]])
    values = array("q", [json_int(value) for value in data["values"]])
    if len(seqs) != len(values) or any(a >= b for a, b in itertools.pairwise(seqs)):
        raise ValueError("digest seqs must be strictly increasing and match the values")
    return Digests(seqs, values, json_int(data["forgotten_below"]))


def _import_echo(data: dict[str, Any]) -> Echo:
    return Echo(
        duplex_epoch=json_int(data["duplex_epoch"]),
        duplex_turn_id=json_int(data["duplex_turn_id"]),
        turn_end=json_bool(data["turn_end"]),
        tts_is_last_chunk=json_bool(data["tts_is_last_chunk"]),
        segment_end=json_bool(data["segment_end"]),
        llm_output_text_utf8=bytes.fromhex(data["llm_output_text_utf8"]),
        produced_at_ms=json_int(data["produced_at_ms"]),
    )
