"""The one driver from input records to audio: wire decode, fold, batched vocoder decode.

The live consumer (consumers.member.service), the offline replay (replay/) and `codeclog verify`
all run this class, so live and offline audio come from the same code path. It does no I/O: the
caller reads records and performs the effects (Kafka produce, files).

A step takes a batch of records (in log order per partition) and returns audio chunks and dead
letters. Decode windows of many requests are gathered and decoded in rounds: each round holds at
most one window per request (a request's windows depend on each other through its vocoder
state), so one `decode_batch` call serves every request that has a window in the step.

Failure isolation: a record that does not decode, or that the fold rejects, becomes a dead
letter; a vocoder failure on one window is retried alone, and if it fails alone it rejects that
request only (dead letter `vocoder_failed`, the stream is evicted from the fold). Nothing else
in the batch is affected.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from codeclog.consumers.stream.fold.cap import evict
from codeclog.consumers.stream.fold.machine import fold
from codeclog.consumers.stream.fold.outcomes import (
    Abandoned,
    Decode,
    Duplicate,
    Outcome,
    Reject,
    RejectReason,
    Release,
)
from codeclog.consumers.stream.fold.report import ReportBuilder
from codeclog.consumers.stream.fold.state import FoldConfig, FoldState, new_state
from codeclog.consumers.stream.limit import EVICTED_BY_CAP, StateSizes
from codeclog.errors import UsageError
from codeclog.kafka.records import InputRecord, Position
from codeclog.schemas import wire
from codeclog.schemas.records import (
    MAX_CODEC_ID,
    SAMPLE_RATE_HZ,
    AudioChunk,
    CodecChunk,
    ControlEvent,
    DeadLetter,
)
from codeclog.vocoder.shared import domain_hift_variant, pcm_s16le, stream_seed

Event = CodecChunk | ControlEvent
KEY_MISMATCH = RejectReason.KEY_MISMATCH.value  # dead-letter reasons of the consumer's own,
MISSING_KEY = RejectReason.MISSING_KEY.value  # in the fold's one closed enum
# A dead letter must always fit the dead-letter topic (the broker's default max.message.bytes
# is 1 MiB, and a refused input can be just under it): a raw value and key up to this many
# bytes are kept whole; beyond, a prefix of DEAD_LETTER_PREFIX_BYTES is kept, with the size and
# SHA-256 of the whole (raw_value_truncated). Text fields are cut to DEAD_LETTER_TEXT_CHARS.
# The consumer lowers the limit to the dead-letter topic's own max.message.bytes minus
# DEAD_LETTER_HEADROOM_BYTES when that is smaller (PipelineConfig.dead_letter_raw_limit).
DEAD_LETTER_RAW_LIMIT = 900_000
DEAD_LETTER_HEADROOM_BYTES = 64 * 1024  # metadata, cut texts and key, batch overhead
DEAD_LETTER_PREFIX_BYTES = 64 * 1024
DEAD_LETTER_KEY_BYTES = 4096
DEAD_LETTER_TEXT_CHARS = 8192


class VocoderEngine(Protocol):
    """What the pipeline needs from vocoder.engine.Code2WavEngine (kept torch-free here): the
    required core. What a real engine states besides is `EngineFacts`, read only where the
    engine has all of it (a test double may have none)."""

    def setup(self, voice: Any = None, seed: int = 0) -> Any: ...

    def decode_batch(
        self, items: Sequence[tuple[Any, Sequence[int], bool]]
    ) -> list[tuple[np.ndarray, Any]]: ...

    def release(self, state: Any) -> None: ...


class ModelCalls(Protocol):
    """Model calls an engine made so far (vocoder.engine.DecodeCalls)."""

    @property
    def flow(self) -> int: ...

    @property
    def hift(self) -> int: ...


@runtime_checkable
class EngineFacts(StateSizes, Protocol):
    """The optional part of an engine, all or nothing (Code2WavEngine states every member):
    its window rules (`check_engine_fits`), the determinism domain stamped on its audio, its
    model-call counts (step metrics) and, from `StateSizes`, the sizes the open-stream budget
    charges (consumers.stream.limit). An engine without them is taken as it is: no rules
    checked, domain "", no call counts, no state budget."""

    @property
    def lookahead_frames(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def domain(self) -> str: ...

    @property
    def calls(self) -> ModelCalls: ...


class EngineMismatchError(UsageError):
    """The engine's window rules differ from the fold's: its windows would be refused or cut
    differently than the fold decided (lookahead frames or codec-id range); or a checkpoint
    was written by an engine of the other HiFT variant (check_checkpoint_fits)."""


def check_checkpoint_fits(request_id: str, written_domain: str, engine_domain: str) -> None:
    """Raise EngineMismatchError when the checkpoint's stream was decoded by a causal HiFT
    engine and this one is non-causal, or the other way round: the stream cannot continue
    here (its audio so far came from another vocoder). Unknown domains ("") are taken as
    they are."""
    if not written_domain or not engine_domain:
        return
    written, here = domain_hift_variant(written_domain), domain_hift_variant(engine_domain)
    if written != here:
        raise EngineMismatchError(
            f"request {request_id}: its checkpoint was written by a {written} HiFT engine "
            f"(domain {written_domain}); this member's engine is {here}: run it with "
            f"--hift {written}"
        )


def check_engine_fits(fold_config: FoldConfig, engine: object) -> None:
    """Raise EngineMismatchError unless the engine's lookahead and codec-id range equal the
    fold's. An engine that does not state them (not `EngineFacts`) is taken as it is."""
    if not isinstance(engine, EngineFacts):
        return
    lookahead = engine.lookahead_frames
    if lookahead != fold_config.lookahead_frames:
        raise EngineMismatchError(
            f"the vocoder's flow takes {lookahead} lookahead ids per window, the fold is "
            f"configured for {fold_config.lookahead_frames} (FoldConfig.lookahead_frames)"
        )
    vocab = engine.vocab_size
    if vocab != MAX_CODEC_ID + 1:
        raise EngineMismatchError(
            f"the vocoder accepts codec ids 0..{vocab - 1}, the wire contract 0..{MAX_CODEC_ID}"
        )


@dataclasses.dataclass(slots=True)
class _Stream:
    """The vocoder side of one request's open epoch."""

    cache_epoch: int
    state: Any
    window_index: int = 0
    samples_emitted: int = 0


@dataclasses.dataclass(slots=True)
class _Window:
    """A decode window waiting for its round, with the record that completed it."""

    decode: Decode
    record: InputRecord | None


@dataclasses.dataclass(slots=True)
class RequestAudio:
    """Per-request audio accounting for reports: every window, a running hash, optional PCM."""

    samples: int = 0
    windows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    hasher: Any = dataclasses.field(default_factory=hashlib.sha256)
    pcm: bytearray | None = None

    def add(self, chunk: AudioChunk, keep_pcm: bool) -> None:
        self.samples += len(chunk.pcm_s16le) // 2
        self.hasher.update(chunk.pcm_s16le)
        self.windows.append(
            {
                "cache_epoch": chunk.cache_epoch,
                "window_index": chunk.window_index,
                "chunk_seqs": list(chunk.chunk_seqs),
                "samples": len(chunk.pcm_s16le) // 2,
                "sha256": chunk.sha256,
                "final": chunk.final,
            }
        )
        if keep_pcm:
            if self.pcm is None:
                self.pcm = bytearray()
            self.pcm += chunk.pcm_s16le

    def summary(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "audio_seconds": round(self.samples / SAMPLE_RATE_HZ, 6),
            "sha256": self.hasher.hexdigest(),
            "windows": self.windows,
        }


@dataclasses.dataclass(slots=True)
class StepOutput:
    """What one step produced. `touched` maps each request seen to its partition."""

    audio: list[AudioChunk] = dataclasses.field(default_factory=list)
    dead_letters: list[DeadLetter] = dataclasses.field(default_factory=list)
    touched: dict[str, int] = dataclasses.field(default_factory=dict)
    epoch_starts: dict[str, int] = dataclasses.field(default_factory=dict)  # rid -> offset
    fatal: Reject | None = None
    records: int = 0
    windows: int = 0
    duplicates: int = 0  # redelivered chunks the fold recognised (same digest): not decoded
    decode_calls: int = 0  # decode_batch calls (rounds)
    flow_calls: int = 0  # the engine's flow calls during this step (engine.calls, if it counts)
    hift_calls: int = 0  # the engine's HiFT calls during this step
    decode_s: float = 0.0
    batch_sizes: list[int] = dataclasses.field(default_factory=list)
    evictions: dict[str, int] = dataclasses.field(default_factory=dict)  # cause -> streams
    # request -> offset of its newest record the fold took in this step (the checkpoints'
    # last_offset: recovery restores the fold's least-recently-active order from it)
    last_offsets: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class PipelineConfig:
    fold: FoldConfig = dataclasses.field(default_factory=FoldConfig)
    per_partition: bool = True  # one fold state per input partition (the live consumer)
    max_batch: int = 64  # windows per decode_batch call
    keep_pcm: bool = False  # keep each request's PCM in memory (replay --wav-dir)
    record_audio: bool = False  # keep per-request window accounting for reports
    producer_id: str = ""
    dead_letter_raw_limit: int = DEAD_LETTER_RAW_LIMIT  # raw bytes a dead letter keeps whole
    # which bound set fold.max_open_streams (consumers.stream.limit): the evictions' cause
    eviction_cause: str = EVICTED_BY_CAP


class AudioPipeline:
    """Wire decode -> fold -> batched vocoder decode, per request, deterministic."""

    def __init__(
        self,
        config: PipelineConfig,
        engine: VocoderEngine | None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self._facts = engine if isinstance(engine, EngineFacts) else None
        check_engine_fits(config.fold, engine)
        # what decides the audio bytes (vocoder.domain), stamped on every AudioChunk
        self.domain = self._facts.domain if self._facts is not None else ""
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._folds: dict[int, FoldState] = {}
        self._streams: dict[str, _Stream] = {}
        self._partition_of: dict[str, int] = {}
        self.report_builder = ReportBuilder(config.fold.policy)
        self.audio: dict[str, RequestAudio] = {}
        self._emitting = True

    # -- public API ----------------------------------------------------------------------------

    def step(self, records: Sequence[InputRecord], emit: bool = True) -> StepOutput:
        """Process records (log order per partition). With emit=False nothing is reported:
        the step only rebuilds fold and vocoder state (recovery)."""
        out = StepOutput()
        pending: dict[str, list[_Window | Outcome]] = {}
        self._emitting = emit
        try:
            for record in records:
                out.records += 1
                event = self._decode(record, out)
                if event is not None:
                    self._fold_one(event, record, pending, out, emit)
            self._run_rounds(pending, out)
        finally:
            self._emitting = True
        if not emit:
            return StepOutput(touched=out.touched, epoch_starts=out.epoch_starts, fatal=out.fatal)
        return out

    def step_events(self, events: Iterable[Event]) -> StepOutput:
        """Process already-decoded events (JSONL scenarios): one partition, no raw bytes."""
        out = StepOutput()
        pending: dict[str, list[_Window | Outcome]] = {}
        for index, event in enumerate(events):
            out.records += 1
            record = InputRecord(Position("", 0, index), event.request_id.encode(), b"")
            self._fold_one(event, record, pending, out, emit=True)
        self._run_rounds(pending, out)
        return out

    def drop_partition(self, partition: int) -> None:
        """Forget every request of a partition (revoked or lost in a rebalance)."""
        self._folds.pop(partition, None)
        for rid in [r for r, p in self._partition_of.items() if p == partition]:
            self._drop_stream(rid)
            del self._partition_of[rid]

    def adopt_streams(
        self, other: AudioPipeline, request_ids: Sequence[str], partition: int
    ) -> None:
        """Take over vocoder streams rebuilt by another pipeline (recovery)."""
        for rid in request_ids:
            stream = other._streams.pop(rid, None)
            if stream is not None:
                self._drop_stream(rid)
                self._streams[rid] = stream
                self._partition_of[rid] = partition

    def fold_state(self, partition: int) -> FoldState:
        key = partition if self.config.per_partition else 0
        state = self._folds.get(key)
        if state is None:
            state = self._folds[key] = new_state(self.config.fold)
        return state

    def open_epoch(self, partition: int, request_id: str) -> int | None:
        """The epoch of a request's open stream, or None."""
        req = self.fold_state(partition).open.get(request_id)
        return None if req is None else req.epoch

    def windows_emitted(self, request_id: str) -> int:
        stream = self._streams.get(request_id)
        return 0 if stream is None else stream.window_index

    def samples_emitted(self, request_id: str) -> int:
        stream = self._streams.get(request_id)
        return 0 if stream is None else stream.samples_emitted

    def open_streams(self) -> int:
        return sum(len(state.open) for state in self._folds.values())

    def report(self) -> dict[str, Any]:
        """The fold report so far; with audio accounting, per-request audio too."""
        result = self.report_builder.result()
        if self.config.record_audio:
            for rid, entry in result["requests"].items():
                audio = self.audio.get(rid, RequestAudio())
                entry["audio"] = audio.summary()
        return result

    # -- decode and fold -----------------------------------------------------------------------

    def _decode(self, record: InputRecord, out: StepOutput) -> Event | None:
        try:
            event = wire.decode(record.value)
        except wire.DecodeError as exc:
            details = {"decode_reason": exc.reason.value}
            out.dead_letters.append(
                self._dead_letter(record, RejectReason.UNDECODABLE_RECORD.value, details, str(exc))
            )
            return None
        if not isinstance(event, CodecChunk | ControlEvent):
            details = {"decode_reason": "unexpected_record_type", "type": type(event).__name__}
            reason = RejectReason.UNDECODABLE_RECORD.value
            out.dead_letters.append(self._dead_letter(record, reason, details, ""))
            return None
        if record.key is None and event.request_id:
            # The key decides the partition, so a keyless record may sit beside other
            # requests' records and break recovery, which re-reads a partition by key.
            details = {"request_id": event.request_id}
            out.dead_letters.append(
                self._dead_letter(
                    record, MISSING_KEY, details, "the record has no key", event.request_id
                )
            )
            return None
        if record.key is not None and record.key != event.request_id.encode():
            details = {"key": _cut(record.key.decode("utf-8", "replace"), 256)}
            out.dead_letters.append(
                self._dead_letter(record, KEY_MISMATCH, details, "", event.request_id)
            )
            return None
        return event

    def _fold_one(
        self,
        event: Event,
        record: InputRecord,
        pending: dict[str, list[_Window | Outcome]],
        out: StepOutput,
        emit: bool,
    ) -> None:
        partition = record.position.partition
        state = self.fold_state(partition)
        rid = event.request_id
        before = self._open_epoch_of(state, rid)
        _, outcomes = fold(state, event)
        after = self._open_epoch_of(state, rid)
        if after is not None and after != before:
            out.epoch_starts[rid] = record.position.offset
        if emit:
            self.report_builder.add(event, outcomes)
        self._partition_of[rid] = partition
        out.touched[rid] = partition
        out.last_offsets[rid] = record.position.offset
        for outcome in outcomes:
            if outcome.request_id != rid:  # C1a: the event evicted another open stream
                self._evicted(outcome, partition, out)
            self._route(outcome, record, pending, out)
        if state.fatal is not None and out.fatal is None:
            out.fatal = state.fatal

    def _evicted(self, outcome: Outcome, partition: int, out: StepOutput) -> None:
        """The victim's closing checkpoint is written in this step's transaction (it is
        touched), so a restart never rebuilds it; its dead letter names the evicting record."""
        out.touched[outcome.request_id] = partition
        if isinstance(outcome, Reject):
            cause = self.config.eviction_cause
            out.evictions[cause] = out.evictions.get(cause, 0) + 1

    @staticmethod
    def _open_epoch_of(state: FoldState, rid: str) -> int | None:
        req = state.open.get(rid)
        return None if req is None else req.epoch

    def _route(
        self,
        outcome: Outcome,
        record: InputRecord,
        pending: dict[str, list[_Window | Outcome]],
        out: StepOutput,
    ) -> None:
        if isinstance(outcome, Decode):
            pending.setdefault(outcome.request_id, []).append(_Window(outcome, record))
        elif isinstance(outcome, Release | Abandoned):
            pending.setdefault(outcome.request_id, []).append(outcome)
        elif isinstance(outcome, Duplicate):
            out.duplicates += 1
        elif isinstance(outcome, Reject):
            details = outcome.details_dict()
            details.setdefault("cache_epoch", outcome.cache_epoch)
            details.setdefault("chunk_seq", outcome.chunk_seq)
            out.dead_letters.append(
                self._dead_letter(record, outcome.reason.value, details, "", outcome.request_id)
            )

    # -- vocoder rounds ------------------------------------------------------------------------

    def _run_rounds(self, pending: dict[str, list[_Window | Outcome]], out: StepOutput) -> None:
        while pending:
            batch: list[_Window] = []
            for rid in list(pending):
                queue = pending[rid]
                while queue and not isinstance(queue[0], _Window):
                    ended = queue.pop(0)
                    assert not isinstance(ended, _Window)
                    self._end_epoch(rid, ended)
                if queue and len(batch) < self.config.max_batch:
                    window = queue.pop(0)
                    assert isinstance(window, _Window)
                    batch.append(window)
                if not queue:
                    del pending[rid]
            if batch:
                self._decode_round(batch, pending, out)

    def _end_epoch(self, rid: str, outcome: Outcome) -> None:
        stream = self._streams.get(rid)
        epoch = getattr(outcome, "cache_epoch", None)
        if stream is not None and stream.cache_epoch == epoch:
            self._drop_stream(rid)

    def _decode_round(
        self, batch: list[_Window], pending: dict[str, list[_Window | Outcome]], out: StepOutput
    ) -> None:
        out.windows += len(batch)
        if self.engine is None:
            return
        streams = [self._stream_for(w.decode) for w in batch]
        items: list[tuple[Any, Sequence[int], bool]] = [
            (s.state, w.decode.codes, w.decode.final) for s, w in zip(streams, batch, strict=True)
        ]
        started = time.perf_counter()
        before = _model_calls(self._facts)
        results = self._decode_isolated(items)
        out.decode_s += time.perf_counter() - started
        after = _model_calls(self._facts)
        out.flow_calls += after[0] - before[0]
        out.hift_calls += after[1] - before[1]
        out.decode_calls += 1
        out.batch_sizes.append(len(batch))
        for window, stream, result in zip(batch, streams, results, strict=True):
            if isinstance(result, Exception):
                self._vocoder_failed(window, result, pending, out)
            else:
                self._emit(window, stream, result, out)

    def _decode_isolated(
        self, items: list[tuple[Any, Sequence[int], bool]]
    ) -> list[tuple[np.ndarray, Any] | Exception]:
        assert self.engine is not None
        try:
            return list(self.engine.decode_batch(items))
        except Exception:  # isolate the failing item: retry each alone
            if len(items) == 1:
                return [self._solo(items[0])]
            return [self._solo(item) for item in items]

    def _solo(self, item: tuple[Any, Sequence[int], bool]) -> tuple[np.ndarray, Any] | Exception:
        assert self.engine is not None
        try:
            return self.engine.decode_batch([item])[0]
        except Exception as exc:  # a vocoder failure costs only this request
            return exc

    def _stream_for(self, decode: Decode) -> _Stream:
        assert self.engine is not None
        rid = decode.request_id
        stream = self._streams.get(rid)
        if stream is None or stream.cache_epoch != decode.cache_epoch:
            self._drop_stream(rid)
            state = self.engine.setup(seed=stream_seed(rid, decode.cache_epoch))
            stream = self._streams[rid] = _Stream(decode.cache_epoch, state)
        return stream

    def _drop_stream(self, rid: str) -> None:
        stream = self._streams.pop(rid, None)
        if stream is not None and self.engine is not None:
            self.engine.release(stream.state)

    def _emit(
        self, window: _Window, stream: _Stream, result: tuple[np.ndarray, Any], out: StepOutput
    ) -> None:
        samples, new_state = result
        stream.state = new_state
        pcm = pcm_s16le(samples)
        decode = window.decode
        chunk = AudioChunk(
            request_id=decode.request_id,
            cache_epoch=decode.cache_epoch,
            chunk_seqs=decode.chunk_seqs,
            window_index=stream.window_index,
            sample_offset=stream.samples_emitted,
            sample_rate_hz=SAMPLE_RATE_HZ,
            pcm_s16le=pcm,
            sha256=hashlib.sha256(pcm).hexdigest(),
            final=decode.final,
            duplex_epoch=decode.echo.duplex_epoch,
            duplex_turn_id=decode.echo.duplex_turn_id,
            turn_end=decode.echo.turn_end,
            tts_is_last_chunk=decode.echo.tts_is_last_chunk,
            segment_end=decode.echo.segment_end,
            llm_output_text_utf8=decode.echo.llm_output_text_utf8,
            source_produced_at_ms=decode.echo.produced_at_ms,
            producer_id=self.config.producer_id,
            determinism_domain=self.domain,
        )
        stream.window_index += 1
        stream.samples_emitted += len(pcm) // 2
        out.audio.append(chunk)
        if self.config.record_audio and self._emitting:
            audio = self.audio.setdefault(decode.request_id, RequestAudio())
            audio.add(chunk, self.config.keep_pcm)

    def _vocoder_failed(
        self,
        window: _Window,
        error: Exception,
        pending: dict[str, list[_Window | Outcome]],
        out: StepOutput,
    ) -> None:
        rid = window.decode.request_id
        pending.pop(rid, None)  # later windows of this request cannot be decoded either
        partition = self._partition_of.get(rid, 0)
        message = f"{type(error).__name__}: {error}"
        self._evict(
            self.fold_state(partition),
            rid,
            RejectReason.VOCODER_FAILED,
            message,
            out,
            window.record,
            window.decode,
        )

    def _evict(
        self,
        state: FoldState,
        rid: str,
        reason: RejectReason,
        message: str,
        out: StepOutput,
        record: InputRecord | None = None,
        decode: Decode | None = None,
    ) -> None:
        outcomes = evict(state, rid)
        self._drop_stream(rid)
        epoch = (
            decode.cache_epoch
            if decode
            else next((o.cache_epoch for o in outcomes if isinstance(o, Reject)), -1)
        )
        details: dict[str, Any] = {"cache_epoch": epoch}
        if decode is not None:
            details["chunk_seqs"] = list(decode.chunk_seqs)
        source = record or InputRecord(Position("", self._partition_of.get(rid, 0), -1), None, b"")
        out.dead_letters.append(self._dead_letter(source, reason.value, details, message, rid))

    # -- records -------------------------------------------------------------------------------

    def _dead_letter(
        self,
        record: InputRecord,
        reason: str,
        details: dict[str, Any],
        error: str,
        request_id: str | None = None,
    ) -> DeadLetter:
        if request_id is None and record.key is not None:
            request_id = record.key.decode("utf-8", "replace")
        value, key = record.value, record.key
        limit = self.config.dead_letter_raw_limit
        truncated = len(value) + len(key or b"") > limit
        if key is not None and len(key) > DEAD_LETTER_KEY_BYTES:
            details = {**details, "raw_key_size": len(key), "raw_key_truncated": True}
            key = key[:DEAD_LETTER_KEY_BYTES]
        text = json.dumps(details, sort_keys=True, separators=(",", ":"), default=str)
        if len(text) > DEAD_LETTER_TEXT_CHARS:
            text = json.dumps({"truncated_details": _cut(text, DEAD_LETTER_TEXT_CHARS - 64)})
        return DeadLetter(
            reason=reason,
            source_topic=record.position.topic,
            source_partition=record.position.partition,
            source_offset=record.position.offset,
            raw_value=value[: min(DEAD_LETTER_PREFIX_BYTES, limit)] if truncated else value,
            raw_key=key,
            request_id=None if request_id is None else _cut(request_id, DEAD_LETTER_KEY_BYTES),
            cache_epoch=_int_or_none(details.get("cache_epoch")),
            chunk_seq=_int_or_none(details.get("chunk_seq")),
            details_json=text,
            error=_cut(error, DEAD_LETTER_TEXT_CHARS),
            dead_lettered_at_ms=self._clock_ms(),
            producer_id=self.config.producer_id,
            raw_value_truncated=truncated,
            raw_value_size=len(value),
            raw_value_sha256=hashlib.sha256(value).hexdigest(),
        )


def _model_calls(facts: EngineFacts | None) -> tuple[int, int]:
    """(flow, HiFT) calls the engine made so far (Code2WavEngine.calls); (0, 0) if untracked."""
    return (0, 0) if facts is None else (facts.calls.flow, facts.calls.hift)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
