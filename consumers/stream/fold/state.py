"""The fold's state: its config, what it keeps per request id, and the whole state.

Treat it as opaque outside the fold package; docs/fold-contract.md, "Memory per request",
states what each record costs in memory.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import enum
from array import array

from codeclog.consumers.stream.fold.outcomes import Echo, Reject, RejectReason
from codeclog.errors import CodeclogError

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
