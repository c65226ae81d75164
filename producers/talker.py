"""The per-step talker API: windowing + publishing, for any number of concurrent requests; it
imports nothing from vllm and no Kafka client (docs/talker.md, "Windowing")."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from codeclog.producers.windowing import (
    ProducerState,
    StepInput,
    WindowingConfig,
    initial_state,
    new_ids,
    step,
)
from codeclog.schemas.records import FRAME_SECONDS, CodecChunk, ControlEvent, ControlKind

Record = CodecChunk | ControlEvent


class RecordSink(Protocol):
    """Where the talker's records go (a ChunkPublisher, or a list in tests)."""

    def publish(self, record: Record) -> None: ...


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclasses.dataclass(frozen=True, slots=True)
class TalkerStats:
    """What a Talker produced (the publisher's stats say what was delivered)."""

    chunks: int  # codec chunk records handed to the sink
    control_events: int
    frames: int  # new codec ids sent (left context and placeholders excluded)
    dropped_frames: int  # ids the windowing discarded (abort, re-admission, retired request)

    @property
    def audio_seconds(self) -> float:
        return self.frames * FRAME_SECONDS


class Talker:
    """Windowing + publishing per talker step, for any number of concurrent requests.

    Call `step` once per talker step and request, as vllm-omni calls its async-chunk hook. The
    state of every request lives here, explicitly; `forget` drops it when the request is gone.
    """

    def __init__(
        self,
        sink: RecordSink,
        *,
        producer_id: str = "",
        config: WindowingConfig | None = None,
        native_duplex: bool = False,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._sink = sink
        self.producer_id = producer_id
        self.config = config or WindowingConfig()
        self.native_duplex = native_duplex
        self._clock_ms = clock_ms
        self._states: dict[str, ProducerState] = {}
        self._chunks = 0
        self._controls = 0
        self._frames = 0
        self._dropped_by_forgotten = 0

    def step(
        self,
        request_id: str,
        codec_ids: Iterable[int] = (),
        *,
        segment_finished: bool = False,
        turn_end: bool = False,
        finished: bool = False,
        aborted: bool = False,
        text_utf8: bytes = b"",
        duplex_epoch: int = -1,
        duplex_turn_id: int = -1,
        internal_request_id: str | None = None,
        native_duplex: bool | None = None,
        codec_frame_valid: Iterable[bool] | None = None,
        ref_audio: bytes | None = None,
        ref_audio_sr: int | None = None,
    ) -> list[Record]:
        """Window one talker step and publish the result; returns the records published."""
        step_input = StepInput(
            request_id=request_id,
            codec_ids=tuple(int(code) for code in codec_ids),
            now_ms=self._clock_ms(),
            internal_request_id=internal_request_id,
            segment_finished=segment_finished,
            finished=finished,
            turn_end=turn_end,
            native_duplex=self.native_duplex if native_duplex is None else native_duplex,
            aborted=aborted,
            text_utf8=bytes(text_utf8),
            duplex_epoch=duplex_epoch,
            duplex_turn_id=duplex_turn_id,
            codec_frame_valid=None if codec_frame_valid is None else tuple(codec_frame_valid),
            ref_audio=ref_audio,
            ref_audio_sr=ref_audio_sr,
        )
        return self.apply(step_input)

    def apply(self, step_input: StepInput) -> list[Record]:
        """`step` for a prepared StepInput (the synthetic talker builds these)."""
        before = self._state(step_input.request_id)
        after, chunks = step(before, step_input)
        self._states[step_input.request_id] = after
        records: list[Record] = [*chunks, *self._controls_for(before, after, step_input, chunks)]
        for record in records:
            self._sink.publish(record)
        self._count(chunks, len(records) - len(chunks))
        return records

    def stream(self, request_id: str) -> TalkerStream:
        """A handle bound to one request id."""
        return TalkerStream(self, request_id)

    def forget(self, request_id: str) -> None:
        """Drop a finished request's state (call it from the engine's request-finished hook)."""
        state = self._states.pop(request_id, None)
        if state is not None:
            self._dropped_by_forgotten += state.dropped_frames + len(state.codec.pending)

    def state(self, request_id: str) -> ProducerState | None:
        return self._states.get(request_id)

    @property
    def stats(self) -> TalkerStats:
        dropped = self._dropped_by_forgotten
        dropped += sum(state.dropped_frames for state in self._states.values())
        return TalkerStats(self._chunks, self._controls, self._frames, dropped)

    def _state(self, request_id: str) -> ProducerState:
        state = self._states.get(request_id)
        if state is None:
            state = initial_state(request_id, producer_id=self.producer_id, config=self.config)
        return state

    def _controls_for(
        self,
        before: ProducerState,
        after: ProducerState,
        step_input: StepInput,
        chunks: list[CodecChunk],
    ) -> list[ControlEvent]:
        internal_id = step_input.internal_request_id or step_input.request_id
        if before.is_retired(internal_id):
            return []  # a stale request: the upstream publishes nothing for it, nor do we
        if step_input.aborted:
            # The consumer may hold frames of this stream; only the talker knows they are dead.
            return [self._control(step_input, ControlKind.ABORT, "aborted")]
        if _leaves_stream_open(after, step_input, chunks):
            # A duplex request that finishes outside a turn end sent no last_chunk; upstream
            # Code2Wav frees such a stream in on_requests_finished. On the log, FINISH does that.
            return [self._control(step_input, ControlKind.FINISH, "request finished")]
        return []

    def _control(self, step_input: StepInput, kind: ControlKind, reason: str) -> ControlEvent:
        return ControlEvent(
            request_id=step_input.request_id,
            kind=kind,
            reason=reason,
            produced_at_ms=step_input.now_ms,
            producer_id=self.producer_id,
        )

    def _count(self, chunks: list[CodecChunk], controls: int) -> None:
        self._chunks += len(chunks)
        self._controls += controls
        self._frames += sum(len(new_ids(chunk)) for chunk in chunks)


def _leaves_stream_open(
    after: ProducerState, step_input: StepInput, chunks: list[CodecChunk]
) -> bool:
    if not step_input.finished or any(chunk.last_chunk for chunk in chunks):
        return False
    return after.chunk_seq > 0  # this epoch has records on the log that no last_chunk closed


class TalkerStream:
    """`Talker.step` bound to one request id."""

    def __init__(self, talker: Talker, request_id: str) -> None:
        self.talker = talker
        self.request_id = request_id

    def step(self, codec_ids: Iterable[int] = (), **fields: Any) -> list[Record]:
        return self.talker.step(self.request_id, codec_ids, **fields)
