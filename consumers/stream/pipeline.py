"""The one driver from input records to audio (wire decode, fold, batched vocoder decode), shared
by the member, replay and verify; no I/O.
Reasons: docs/operating.md, "A step and its transaction"."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from codeclog.consumers.stream.audio import RequestAudio
from codeclog.consumers.stream.dead_letter import DEAD_LETTER_RAW_LIMIT, dead_letter
from codeclog.consumers.stream.engine import (
    EngineFacts,
    VocoderEngine,
    check_engine_fits,
    model_calls,
)
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
from codeclog.consumers.stream.fold.rules import Event, evict, fold
from codeclog.consumers.stream.fold.state import (
    FoldConfig,
    FoldState,
    new_state,
    remembered_requests,
    state_bytes,
)
from codeclog.consumers.stream.limit import EVICTED_BY_CAP
from codeclog.consumers.stream.rounds import Pending, Window, next_round
from codeclog.consumers.stream.vocoder_streams import (
    Item,
    Result,
    VocoderStream,
    VocoderStreams,
)
from codeclog.consumers.stream.wire_input import Refusal, decode_input
from codeclog.kafka.records import InputRecord, Position
from codeclog.schemas.records import AudioChunk, DeadLetter


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
    # keep every outcome of every request for `report()` (replay); the live member, which runs
    # for days and never reports, keeps none (consumers.member.config)
    report: bool = True
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
        report_builder: ReportBuilder | None = None,
    ) -> None:
        """`report_builder` is given every folded event and its outcomes (`report()`); by
        default a ReportBuilder of the fold's policy."""
        self.config = config
        self.engine = engine
        self._facts = engine if isinstance(engine, EngineFacts) else None
        check_engine_fits(config.fold, engine)
        # what decides the audio bytes (vocoder.domain), stamped on every AudioChunk
        self.domain = self._facts.domain if self._facts is not None else ""
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._folds: dict[int, FoldState] = {}
        self._vocoder = VocoderStreams(engine)
        self._partition_of: dict[str, int] = {}
        if report_builder is None:
            report_builder = ReportBuilder(config.fold.policy)
        self._report_builder = report_builder
        self.audio: dict[str, RequestAudio] = {}
        self._emitting = True

    # -- public API ----------------------------------------------------------------------------

    def step(self, records: Sequence[InputRecord], emit: bool = True) -> StepOutput:
        """Process records (log order per partition). With emit=False nothing is reported:
        the step only rebuilds fold and vocoder state (recovery)."""
        out = StepOutput()
        pending: Pending = {}
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
        self._forget_finished(out.touched)
        if not emit:
            return StepOutput(touched=out.touched, epoch_starts=out.epoch_starts, fatal=out.fatal)
        return out

    def step_events(self, events: Iterable[Event]) -> StepOutput:
        """Process already-decoded events (JSONL scenarios): one partition, no raw bytes."""
        out = StepOutput()
        pending: Pending = {}
        for index, event in enumerate(events):
            out.records += 1
            record = InputRecord(Position("", 0, index), event.request_id.encode(), b"")
            self._fold_one(event, record, pending, out, emit=True)
        self._run_rounds(pending, out)
        self._forget_finished(out.touched)
        return out

    def _forget_finished(self, touched: dict[str, int]) -> None:
        """Forget where the requests of a step live once they have neither an open stream nor
        a vocoder stream: a member sees thousands of requests an hour."""
        for rid, partition in touched.items():
            state = self.fold_state(partition)
            if self._open_epoch_of(state, rid) is None and self._vocoder.get(rid) is None:
                self._partition_of.pop(rid, None)

    def drop_partition(self, partition: int) -> None:
        """Forget every request of a partition (revoked or lost in a rebalance)."""
        self._folds.pop(partition, None)
        for rid in [r for r, p in self._partition_of.items() if p == partition]:
            self._vocoder.drop(rid)
            del self._partition_of[rid]

    def adopt_streams(
        self, other: AudioPipeline, request_ids: Sequence[str], partition: int
    ) -> None:
        """Take over vocoder streams rebuilt by another pipeline (recovery)."""
        for rid in request_ids:
            if self._vocoder.adopt(other._vocoder, rid):
                self._partition_of[rid] = partition

    def fold_state(self, partition: int) -> FoldState:
        key = partition if self.config.per_partition else 0
        state = self._folds.get(key)
        if state is None:
            state = self._folds[key] = new_state(self.config.fold)
        return state

    def open_epoch(self, partition: int, request_id: str) -> int | None:
        """The epoch of a request's open stream, or None."""
        return self._open_epoch_of(self.fold_state(partition), request_id)

    def windows_emitted(self, request_id: str) -> int:
        stream = self._vocoder.get(request_id)
        return 0 if stream is None else stream.window_index

    def samples_emitted(self, request_id: str) -> int:
        stream = self._vocoder.get(request_id)
        return 0 if stream is None else stream.samples_emitted

    def open_streams(self) -> int:
        return sum(len(state.open) for state in self._folds.values())

    def fold_state_bytes(self) -> int:
        """The estimated bytes of every fold state (`state_bytes` walks every request)."""
        return sum(state_bytes(state) for state in self._folds.values())

    def remembered_requests(self) -> int:
        """Requests the fold states remember, open or as tombstones."""
        return sum(remembered_requests(state) for state in self._folds.values())

    def report(self) -> dict[str, Any]:
        """The fold report so far; with audio accounting, per-request audio too."""
        result = self._report_builder.result()
        if self.config.record_audio:
            for rid, entry in result["requests"].items():
                audio = self.audio.get(rid, RequestAudio())
                entry["audio"] = audio.summary()
        return result

    # -- decode and fold -----------------------------------------------------------------------

    def _decode(self, record: InputRecord, out: StepOutput) -> Event | None:
        decoded = decode_input(record)
        if isinstance(decoded, Refusal):
            out.dead_letters.append(self._dead_letter(record, *decoded))
            return None
        return decoded

    def _fold_one(
        self,
        event: Event,
        record: InputRecord,
        pending: Pending,
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
        if emit and self.config.report:
            self._report_builder.add(event, outcomes)
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
        pending: Pending,
        out: StepOutput,
    ) -> None:
        if isinstance(outcome, Decode):
            pending.setdefault(outcome.request_id, []).append(Window(outcome, record))
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

    def _run_rounds(self, pending: Pending, out: StepOutput) -> None:
        while pending:
            batch = next_round(pending, self.config.max_batch, self._end_epoch)
            if batch:
                self._decode_round(batch, pending, out)

    def _end_epoch(self, rid: str, outcome: Outcome) -> None:
        self._vocoder.end_epoch(rid, getattr(outcome, "cache_epoch", None))

    def _decode_round(self, batch: list[Window], pending: Pending, out: StepOutput) -> None:
        out.windows += len(batch)
        if self.engine is None:
            return
        streams = [self._vocoder.for_window(w.decode) for w in batch]
        items: list[Item] = [
            (s.state, w.decode.codes, w.decode.final) for s, w in zip(streams, batch, strict=True)
        ]
        started = time.perf_counter()
        before = model_calls(self._facts)
        results = self._vocoder.decode(items)
        out.decode_s += time.perf_counter() - started
        after = model_calls(self._facts)
        out.flow_calls += after[0] - before[0]
        out.hift_calls += after[1] - before[1]
        out.decode_calls += 1
        out.batch_sizes.append(len(batch))
        for window, stream, result in zip(batch, streams, results, strict=True):
            if isinstance(result, Exception):
                self._vocoder_failed(window, result, pending, out)
            else:
                self._emit(window, stream, result, out)

    def _emit(
        self,
        window: Window,
        stream: VocoderStream,
        result: Result,
        out: StepOutput,
    ) -> None:
        chunk = stream.emit(window.decode, result, self.config.producer_id, self.domain)
        out.audio.append(chunk)
        if self.config.record_audio and self._emitting:
            audio = self.audio.setdefault(window.decode.request_id, RequestAudio())
            audio.add(chunk, self.config.keep_pcm)

    def _vocoder_failed(
        self,
        window: Window,
        error: Exception,
        pending: Pending,
        out: StepOutput,
    ) -> None:
        """Evict the request whose window failed alone: it costs that request only."""
        decode, rid = window.decode, window.decode.request_id
        pending.pop(rid, None)  # later windows of this request cannot be decoded either
        partition = self._partition_of.get(rid, 0)
        evict(self.fold_state(partition), rid)
        self._vocoder.drop(rid)
        details = {"cache_epoch": decode.cache_epoch, "chunk_seqs": list(decode.chunk_seqs)}
        source = window.record or InputRecord(Position("", partition, -1), None, b"")
        reason, message = RejectReason.VOCODER_FAILED.value, f"{type(error).__name__}: {error}"
        out.dead_letters.append(self._dead_letter(source, reason, details, message, rid))

    # -- records -------------------------------------------------------------------------------

    def _dead_letter(
        self,
        record: InputRecord,
        reason: str,
        details: dict[str, Any],
        error: str,
        request_id: str | None = None,
    ) -> DeadLetter:
        config = self.config
        limit, producer_id = config.dead_letter_raw_limit, config.producer_id
        at_ms = self._clock_ms()
        return dead_letter(
            record,
            reason,
            details,
            error,
            request_id,
            raw_limit=limit,
            at_ms=at_ms,
            producer_id=producer_id,
        )
