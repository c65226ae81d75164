"""Typed, frozen records of the codeclog wire contract: plain value objects, standard library only
(the wire form is `schemas.wire`), their defaults the upstream Code2Wav's for a missing field
(docs/fold-contract.md, "Terms")."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

SILENCE_CODE = 4218  # the talker's silence id; the first window of a stream opens with 3 of them
CODEC_VOCAB = 6561  # valid codec ids are 0..6560 (6561 is the talker's EOS)
MAX_CODEC_ID = CODEC_VOCAB - 1  # 6561 is the talker's EOS and never reaches the vocoder
FRAME_SECONDS = 0.04  # one codec frame is 40 ms (25 Hz)
SAMPLE_RATE_HZ = 24000
SAMPLES_PER_FRAME = 960


def first_invalid_code(ids: tuple[int, ...]) -> int | None:
    """The index of the first id outside 0..MAX_CODEC_ID, None when all are codec ids: the
    one range check of codeclog (the fold's T2a).
    min/max first: C loops, so a valid window costs no Python-level iteration."""
    if not ids or (min(ids) >= 0 and max(ids) <= MAX_CODEC_ID):
        return None
    return next(i for i, code in enumerate(ids) if not 0 <= code <= MAX_CODEC_ID)


@dataclasses.dataclass(frozen=True, slots=True)
class CodecChunk:
    """One payload of the talker's async-chunk producer (`tts2code2wav_async_chunk`)."""

    request_id: str  # external request id; the Kafka key. Empty means missing.
    codes: tuple[int, ...]  # the window: left context + new ids, or the [0] placeholder
    cache_epoch: int = 0  # stream generation: bumped on turn end and on re-admission
    chunk_seq: int = 0  # counts every payload of the epoch, boundary placeholders included
    code_flat_numel: int | None = None  # real ids in `codes`; None means len(codes) (upstream)
    codec_chunk_frames: int = 0  # new ids in this window (not read by the upstream Code2Wav)
    codec_left_context_frames: int = 0  # prepended context ids (3 or 0); read by fold rule A4
    last_chunk: bool = False  # the codec stream of this epoch ends
    tts_is_last_chunk: bool = False  # this payload flushes a talker unit, segment or request
    turn_end: bool = False  # duplex turn end (echoed)
    duplex_epoch: int = -1  # duplex session fence epoch (echoed, never used for positions)
    duplex_turn_id: int = -1  # duplex turn id (echoed)
    llm_output_text_utf8: bytes = b""  # unit transcript, attached once per unit (echoed)
    segment_end: bool = False  # full-payload path only (echoed)
    ref_audio: bytes | None = None  # reference voice, float32 little-endian mono, chunk 0 only
    ref_audio_sr: int | None = None  # sample rate of ref_audio; required when it is present
    prompt_cache_id: str | None = None  # explicit voice prompt id override
    produced_at_ms: int = 0  # producer wall clock when the payload was made (Unix ms)
    producer_id: str = ""  # which talker process produced it
    streaming_condition_seq: int | None = None  # talker's meta.streaming_condition_seq (wire v2)

    @property
    def frames(self) -> int:
        """The number of real codec ids (`code_flat_numel`, defaulting to len(codes))."""
        return len(self.codes) if self.code_flat_numel is None else self.code_flat_numel


class ControlKind(enum.Enum):
    ABORT = "abort"  # drop the request's state and held frames
    FINISH = "finish"  # flush held frames as a final window, then release


@dataclasses.dataclass(frozen=True, slots=True)
class ControlEvent:
    """A stream control event travelling on the chunk topic, keyed by request id."""

    request_id: str
    kind: ControlKind
    reason: str = ""  # free text, e.g. the upstream abort status
    produced_at_ms: int = 0
    producer_id: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class AudioChunk:
    """The audio of one decode window, keyed by request id on the audio topic."""

    request_id: str
    cache_epoch: int
    chunk_seqs: tuple[int, ...]  # the codec chunks merged into this window, in order
    window_index: int  # 0-based ordinal of the decode window within (request, epoch)
    sample_offset: int  # samples of this (request, epoch) emitted before this chunk
    sample_rate_hz: int
    pcm_s16le: bytes  # mono 16-bit little-endian PCM
    sha256: str  # hex SHA-256 of pcm_s16le
    final: bool  # the last audio of this epoch's stream
    duplex_epoch: int = -1
    duplex_turn_id: int = -1
    turn_end: bool = False
    tts_is_last_chunk: bool = False
    segment_end: bool = False
    llm_output_text_utf8: bytes = b""
    source_produced_at_ms: int = 0  # produced_at of the newest chunk in the window
    producer_id: str = ""  # the consumer instance (transactional id) that wrote it
    determinism_domain: str = ""  # what decided the bytes (vocoder.domain); "" = unknown (v1)


@dataclasses.dataclass(frozen=True, slots=True)
class DeadLetter:
    """A refused input: why, where it was in the stream, and the raw record (whole, or a
    bounded prefix with the size and SHA-256 of the whole when it would not fit the topic)."""

    reason: str  # a stable rejection reason (consumers.stream.fold RejectReason or decode reason)
    source_topic: str
    source_partition: int
    source_offset: int
    raw_value: bytes  # the record's value bytes exactly as consumed
    raw_key: bytes | None = None
    request_id: str | None = None
    cache_epoch: int | None = None
    chunk_seq: int | None = None
    details_json: str = "{}"  # JSON object, sorted keys
    error: str = ""  # human-readable message (exception text for vocoder failures)
    dead_lettered_at_ms: int = 0
    producer_id: str = ""
    # v2: a value too large for the dead-letter topic is kept as a bounded prefix
    raw_value_truncated: bool = False  # raw_value is only a prefix of the consumed value
    raw_value_size: int = -1  # bytes of the whole consumed value (-1: v1, raw_value is whole)
    raw_value_sha256: str = ""  # hex SHA-256 of the whole consumed value ("" in v1 records)


@dataclasses.dataclass(frozen=True, slots=True)
class StreamCheckpoint:
    """Recovery progress of one request, written with the audio in the same transaction.

    Lives on the compacted progress topic, keyed by request id, in the partition numbered like
    the request's input partition. See docs/operating.md, "How recovery works".
    """

    request_id: str
    input_topic: str
    input_partition: int
    open: bool  # the request has an open stream (its vocoder state must be rebuilt)
    cache_epoch: int  # the newest epoch the fold has seen (-1: none)
    epoch_start_offset: int  # input offset where the open epoch started (-1 when closed)
    last_offset: int  # the request's newest input offset applied in that transaction
    windows_emitted: int  # audio windows of the open epoch written so far
    samples_emitted: int  # samples of the open epoch written so far
    fold_state_json: str = ""  # consumers.stream.fold.state.export_request(), JSON; "" = unknown
    updated_at_ms: int = 0
    producer_id: str = ""
    consumer_group: str = ""  # v2: whose progress this is ("" in v1 records: shared by all)
    determinism_domain: str = ""  # the decoding member's vocoder.domain; "" = unknown (v1)


@dataclasses.dataclass(frozen=True, slots=True)
class HandOutMark:
    """The end of one request at a connector receiver, on the edge's hand-out ledger."""

    request_id: str
    consumer_group: str
    input_topic: str
    input_partition: int  # -1: nothing of the request was read
    last_offset: int  # its last record read when it ended (-1: none)
    reason: HandOutEnd
    produced_at_ms: int = 0
    producer_id: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class HandOutMove:
    """A request the orchestrator moved to another replica, on the edge's hand-out ledger:
    its earlier endings are void (omni.redispatch)."""

    request_id: str
    consumer_group: str  # the replica it moved from
    input_topic: str
    produced_at_ms: int = 0
    producer_id: str = ""


class HandOutEnd(enum.Enum):
    """Why a request ended at a vllm-omni connector receiver (omni.index)."""

    FINISHED = "finished"
    TIMED_OUT = "timed_out"
    CLEANUP = "cleanup"


def to_dict(record: Any) -> dict[str, Any]:
    """A record as a plain dict with enums as their values (the Avro boundary uses this)."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if isinstance(value, enum.Enum):
            value = value.value
        elif isinstance(value, tuple):
            value = list(value)
        out[field.name] = value
    return out


def slot_constructor(record_type: type) -> Callable[..., Any]:
    """A function of the field values (in field order) that returns a `record_type` instance,
    several times faster than the frozen dataclass's __init__ (used on the decode and fold hot
    paths).

    A frozen slotted dataclass's __init__ pays an `object.__setattr__` per field, and calling
    the slot descriptors one by one is not much cheaper. This fills an instance of a plain
    class with the very same slots and then sets its `__class__` to the record type: CPython
    allows that only between classes of identical layout (it raises TypeError otherwise), so
    the result is a genuine `record_type` instance, equal to the one __init__ would build (tests
    check it). Only for types without `__post_init__`: nothing of __init__ may be skipped.
    """
    names = tuple(f.name for f in dataclasses.fields(record_type))
    if getattr(record_type, "__slots__", None) != names or hasattr(record_type, "__post_init__"):
        raise TypeError(f"{record_type.__name__} is not a slotted record without __post_init__")
    twin = type(f"_{record_type.__name__}Slots", (), {"__slots__": names})
    arguments = ", ".join(names)
    body = "".join(f"    record.{name} = {name}\n" for name in names)
    source = (
        f"def build({arguments}):\n    record = new(twin)\n{body}"
        "    record.__class__ = record_type\n    return record\n"
    )
    namespace: dict[str, Any] = {"new": object.__new__, "twin": twin, "record_type": record_type}
    exec(source, namespace)  # the generated function: plain slot stores, no lookups by name
    build: Callable[..., Any] = namespace["build"]
    return build


class PayloadKind(enum.Enum):
    """What one node of a generic payload is (`PayloadEntry.kind`)."""

    NONE = "none"
    BOOL = "bool"
    INT = "int"
    FLOAT = "float"
    STR = "str"
    BYTES = "bytes"
    TENSOR = "tensor"  # a torch tensor: dtype, shape, raw little-endian C-order bytes
    NDARRAY = "ndarray"  # a numpy array, the same way
    DICT = "dict"  # a container: its children follow, their path one key longer
    LIST = "list"
    TUPLE = "tuple"


@dataclasses.dataclass(frozen=True, slots=True)
class PayloadEntry:
    """One node of a payload tree, in pre-order (a container comes before its children)."""

    path: tuple[str, ...]  # dict keys (list/tuple indices as decimal strings) from the root
    kind: PayloadKind
    bool_value: bool | None = None
    int_value: int | None = None
    float_value: float | None = None
    str_value: str | None = None
    bytes_value: bytes | None = None  # bytes, or an array's raw data
    dtype: str | None = None  # array element type, e.g. "int64", "bool", "bfloat16"
    shape: tuple[int, ...] = ()  # array shape
    source: str | None = None  # "codec_chunk.<field>": the value travels in the CodecChunk


@dataclasses.dataclass(frozen=True, slots=True)
class PayloadEnvelope:
    """Any payload of a vllm-omni stage edge, typed: what the Kafka OmniConnector writes.

    As a record value it carries a whole payload (any stage edge). As the `codeclog.payload`
    header of a CodecChunk record it carries the payload's shape, with the values that the
    chunk already holds referenced by `PayloadEntry.source` instead of repeated.
    """

    request_id: str  # the external request id (the Kafka key)
    from_stage: str
    to_stage: str
    put_key: str  # the connector's put key, `{external_req_id}_{stage}_{chunk_id}`
    entries: tuple[PayloadEntry, ...]  # the payload tree in pre-order
    chunk_id: int | None = None  # parsed from put_key when it has that form
    produced_at_ms: int = 0
    producer_id: str = ""
