"""What one event does to a request's codec stream: closed enums and frozen outcome values, each
rendering its own report (`to_report`). Why their strings never change: docs/fold-contract.md."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar

from codeclog.schemas.records import CodecChunk


class OutcomeKind(enum.Enum):
    DECODE = "decode"  # decode this window
    HOLD = "hold"  # frames kept for the next window (tolerant)
    MARKER = "marker"  # segment boundary: position advances, no audio
    RELEASE = "release"  # the epoch's stream ended; its state is dropped (a tombstone remains)
    REJECT = "reject"  # the event is refused and dead-lettered
    GAP = "gap"  # chunks in a range never arrived
    DUPLICATE = "duplicate"  # a redelivery of an applied chunk (same digest): ignored
    ABANDONED = "abandoned"  # a newer epoch started while this one held frames


class RejectReason(enum.Enum):
    """Why an event was refused. Upstream reasons keep the upstream spelling."""

    # Raised by the upstream Code2Wav `_parse_item` / `decode_batch` (strict policy).
    MISSING_REQUEST_ID = "missing_request_id"
    NEGATIVE_STREAM_POSITION = "negative_stream_position"
    MISSING_STATE_FOR_CHUNK = "missing_state_for_chunk"
    STALE_CACHE_EPOCH = "stale_cache_epoch"
    NEW_EPOCH_REQUIRES_FIRST_CHUNK = "new_epoch_requires_first_chunk"
    STALE_OR_REORDERED_CHUNK = "stale_or_reordered_chunk"
    EMPTY_NONFINAL_CHUNK = "empty_nonfinal_chunk"
    CHUNK_BELOW_LOOKAHEAD_WINDOW = "chunk_below_lookahead_window"
    BACKEND_UNSUPPORTED_OR_FAILED = "backend_unsupported_or_failed"
    # Tolerant policy only.
    STREAM_POSITION_OUT_OF_RANGE = "stream_position_out_of_range"  # T2: above the wire's int32
    CHUNK_AFTER_FINAL = "chunk_after_final"  # T3: a released epoch gets a new chunk
    CONFLICTING_DUPLICATE = "conflicting_duplicate"  # T6: same position, other content
    LATE_CHUNK = "late_chunk"  # T6a: a position already declared missing by a gap
    ABORTED = "aborted"  # T3a: a chunk of an epoch ended by an abort control event
    EVICTED = "evicted"  # the consumer dropped the stream; also T3a for its late chunks
    # Content checks (rule T2a / S2a) and the consumer's own reasons.
    INVALID_CODES = "invalid_codes"  # a codec id outside 0..6560 in codes[:frames]
    INVALID_FRAME_COUNT = "invalid_frame_count"  # code_flat_numel < 0 or > len(codes)
    UNDECODABLE_RECORD = "undecodable_record"  # the wire bytes did not decode (consumer)
    VOCODER_FAILED = "vocoder_failed"  # the vocoder raised on this window (consumer)
    KEY_MISMATCH = "key_mismatch"  # the record key is not the chunk's request id (consumer)
    MISSING_KEY = "missing_key"  # a record without a key; its body names one (consumer)


Details = tuple[tuple[str, Any], ...]


def details_of(**values: Any) -> Details:
    """Reject details as an immutable, key-sorted tuple of pairs."""
    return tuple(sorted(values.items()))


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _report(outcome: Outcome | _AtChunk, *keys: str) -> dict[str, Any]:
    """The outcome's report: its kind, then `keys` in order (tuples as lists, enums as values)."""
    report: dict[str, Any] = {"kind": outcome.kind.value}
    for key in keys:
        value = getattr(outcome, key)
        report[key] = value.value if isinstance(value, enum.Enum) else _plain(value)
    return report


@dataclasses.dataclass(frozen=True, slots=True)
class Echo:
    """Metadata of a decode window that the audio record repeats (never used for positions).

    Flags are OR-ed over the chunks merged into the window, the transcript is their
    concatenation in order, the duplex ids and the clock come from the newest chunk.
    """

    duplex_epoch: int = -1
    duplex_turn_id: int = -1
    turn_end: bool = False
    tts_is_last_chunk: bool = False
    segment_end: bool = False
    llm_output_text_utf8: bytes = b""
    produced_at_ms: int = 0  # producer clock of the newest chunk in the window (Unix ms)

    @classmethod
    def of(cls, chunk: CodecChunk) -> Echo:
        return cls(
            chunk.duplex_epoch,
            chunk.duplex_turn_id,
            chunk.turn_end,
            chunk.tts_is_last_chunk,
            chunk.segment_end,
            chunk.llm_output_text_utf8,
            chunk.produced_at_ms,
        )

    def then(self, newer: Echo) -> Echo:
        """This window's echo followed by a newer chunk's."""
        return Echo(
            newer.duplex_epoch,
            newer.duplex_turn_id,
            self.turn_end or newer.turn_end,
            self.tts_is_last_chunk or newer.tts_is_last_chunk,
            self.segment_end or newer.segment_end,
            self.llm_output_text_utf8 + newer.llm_output_text_utf8,
            newer.produced_at_ms,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Decode:
    """Decode this window: held chunks merged with the current one, left context included.

    `echo` (the metadata the audio record repeats) is computed on access from `newest` and
    `held`: most windows are one chunk, and building it eagerly would cost the fold about a
    quarter of its time per event.
    """

    kind: ClassVar[OutcomeKind] = OutcomeKind.DECODE
    request_id: str
    cache_epoch: int
    chunk_seqs: tuple[int, ...]  # the chunks merged into the window, in order
    frames: int  # ids in the window, left context included (== len(codes))
    final: bool  # the last window of the epoch: the vocoder flushes its tail
    codes: tuple[int, ...]  # the window's codec ids (not in the report)
    newest: CodecChunk | None  # the newest chunk of the window, if it brought ids or the end
    held: Echo | None = None  # the echo of the held chunks in front of `newest`

    @property
    def echo(self) -> Echo:
        """Metadata for the audio record (not in the report)."""
        if self.newest is None:
            return self.held or Echo()
        newest = Echo.of(self.newest)
        return newest if self.held is None else self.held.then(newest)

    def to_report(self) -> dict[str, Any]:
        return _report(self, "cache_epoch", "chunk_seqs", "frames", "final")


@dataclasses.dataclass(frozen=True, slots=True)
class Hold:
    """Frames kept for the next window because a non-final window would be too short."""

    kind: ClassVar[OutcomeKind] = OutcomeKind.HOLD
    request_id: str
    cache_epoch: int
    chunk_seq: int
    frames: int  # ids held after this event

    def to_report(self) -> dict[str, Any]:
        return _report(self, "cache_epoch", "chunk_seq", "frames")


@dataclasses.dataclass(frozen=True, slots=True)
class _AtChunk:
    """An outcome that is all position: the chunk (`cache_epoch`, `chunk_seq`) it is about."""

    kind: ClassVar[OutcomeKind]
    request_id: str
    cache_epoch: int
    chunk_seq: int

    def to_report(self) -> dict[str, Any]:
        return _report(self, "cache_epoch", "chunk_seq")


@dataclasses.dataclass(frozen=True, slots=True)
class Marker(_AtChunk):
    """A segment boundary: the position advances, no audio."""

    kind: ClassVar[OutcomeKind] = OutcomeKind.MARKER


@dataclasses.dataclass(frozen=True, slots=True)
class Duplicate(_AtChunk):
    """A redelivery of a chunk already applied (same digest, or too old to verify)."""

    kind: ClassVar[OutcomeKind] = OutcomeKind.DUPLICATE


@dataclasses.dataclass(frozen=True, slots=True)
class Release:
    """The epoch's stream is finished; its vocoder state can be freed."""

    kind: ClassVar[OutcomeKind] = OutcomeKind.RELEASE
    request_id: str
    cache_epoch: int

    def to_report(self) -> dict[str, Any]:
        return _report(self, "cache_epoch")


@dataclasses.dataclass(frozen=True, slots=True)
class Reject:
    """The event is refused; it goes to the dead-letter topic with `reason`.

    `cache_epoch` / `chunk_seq` are the event's own (-1 for a control event, which has none).
    """

    kind: ClassVar[OutcomeKind] = OutcomeKind.REJECT
    request_id: str
    reason: RejectReason
    cache_epoch: int
    chunk_seq: int
    details: Details = ()  # key-sorted pairs; strict: the upstream error JSON's keys

    def details_dict(self) -> dict[str, Any]:
        return {key: _plain(value) for key, value in self.details}

    def to_report(self) -> dict[str, Any]:
        return {
            **_report(self, "reason", "cache_epoch", "chunk_seq"),
            "details": self.details_dict(),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class Gap:
    """Chunks `missing_from..missing_to` (inclusive) never arrived before a later one."""

    kind: ClassVar[OutcomeKind] = OutcomeKind.GAP
    request_id: str
    cache_epoch: int
    missing_from: int
    missing_to: int
    discarded_frames: int  # held frames dropped because continuity is broken

    def to_report(self) -> dict[str, Any]:
        return _report(self, "cache_epoch", "missing_from", "missing_to", "discarded_frames")


@dataclasses.dataclass(frozen=True, slots=True)
class Abandoned:
    """A newer epoch started while this epoch still held frames; they are dropped."""

    kind: ClassVar[OutcomeKind] = OutcomeKind.ABANDONED
    request_id: str
    cache_epoch: int
    frames: int

    def to_report(self) -> dict[str, Any]:
        return _report(self, "cache_epoch", "frames")


Outcome = Decode | Hold | Marker | Release | Reject | Gap | Duplicate | Abandoned
