"""Seeded, upstream-like codec streams for the fold's tests and benchmark (not used at run time).
The model: docs/talker.md, "The fold's test streams"."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any, Literal

from codeclog.schemas.records import SILENCE_CODE, CodecChunk

PLACEHOLDER = (0,)
_End = Literal["", "unit", "stream"]  # what a payload flushes: nothing, a talker unit, the stream
MAX_CODEC_ID = 6560


@dataclasses.dataclass(frozen=True, slots=True)
class StreamShape:
    """The producer's windowing settings."""

    chunk_frames: int = 25  # new ids per steady window
    left_context_frames: int = 3  # ids of the previous window repeated in front
    initial_frames: int = 25  # new ids of the first window
    preroll: bool = True  # open the first window with `left_context_frames` silence ids
    min_unit_frames: int = 5  # duplex units below this are held back (0: never)


@dataclasses.dataclass(slots=True)
class _Producer:
    request_id: str
    cache_epoch: int
    shape: StreamShape
    duplex_turn_id: int
    context: list[int]
    chunks: list[CodecChunk] = dataclasses.field(default_factory=list)
    pending: list[int] = dataclasses.field(default_factory=list)
    sent: bool = False
    text: bytes = b""

    def emit(
        self, codes: Sequence[int], numel: int, new: int, context: int, end: _End = ""
    ) -> None:
        self.chunks.append(
            CodecChunk(
                request_id=self.request_id,
                codes=tuple(codes),
                cache_epoch=self.cache_epoch,
                chunk_seq=len(self.chunks),
                code_flat_numel=numel,
                codec_chunk_frames=new,
                codec_left_context_frames=context,
                duplex_epoch=0,
                duplex_turn_id=self.duplex_turn_id,
                llm_output_text_utf8=self.text if new else b"",
                produced_at_ms=1_000 * self.duplex_turn_id + 40 * len(self.chunks),
                producer_id="synth",
                last_chunk=end == "stream",
                tts_is_last_chunk=bool(end),
                turn_end=end == "stream",
            )
        )
        if new:
            self.text = b""  # the unit text rides on the unit's first payload with audio

    def window(self, new: list[int], end: _End = "") -> None:
        codes = [*self.context, *new]
        self.emit(codes, len(codes), len(new), len(self.context), end)
        self.context = codes[-self.shape.left_context_frames :]
        self.sent = True

    def placeholder(self, end: _End) -> None:
        self.emit(PLACEHOLDER, 0, 0, 0, end)

    def push(self, code: int) -> None:
        self.pending.append(code)
        limit = self.shape.chunk_frames if self.sent else self.shape.initial_frames
        if len(self.pending) >= limit:
            self.window(self.pending[:limit])
            del self.pending[:limit]

    def flush_unit(self) -> None:
        if 0 < len(self.pending) < self.shape.min_unit_frames or not self.pending:
            self.placeholder("unit")  # hold_short_unit / empty flush
            return
        self.window(self.pending, "unit")
        self.pending = []

    def finish(self) -> None:
        if self.pending:
            self.window(self.pending, "stream")  # short final
        elif self.sent:
            held = self.context  # exact-boundary final: the held context ids again
            self.emit(held, len(held), 0, len(held), "stream")
        else:
            self.placeholder("stream")  # terminal sentinel


def encode_stream(
    request_id: str,
    units: Sequence[Sequence[int]],
    cache_epoch: int = 0,
    shape: StreamShape | None = None,
    duplex_turn_id: int = 0,
) -> list[CodecChunk]:
    """The payloads of one epoch: every unit flushed, the last one ending the stream."""
    shape = shape or StreamShape()
    preroll = [SILENCE_CODE] * shape.left_context_frames if shape.preroll else []
    producer = _Producer(request_id, cache_epoch, shape, duplex_turn_id, preroll)
    for index, unit in enumerate(units):
        producer.text = f"unit {index}".encode()
        for code in unit:
            producer.push(code)
        if index < len(units) - 1:
            producer.flush_unit()
    producer.finish()
    return producer.chunks


def random_units(rng: random.Random, units: int, max_unit_frames: int) -> list[list[int]]:
    """`units` talker units of 0..max_unit_frames random codec ids each."""
    return [
        [rng.randint(0, MAX_CODEC_ID) for _ in range(rng.randint(0, max_unit_frames))]
        for _ in range(units)
    ]


def session_stream(
    rng: random.Random, request_id: str, turns: int, shape: StreamShape | None = None
) -> list[CodecChunk]:
    """A duplex session: `turns` epochs (0, 1, ...), each a few units of speech."""
    chunks: list[CodecChunk] = []
    for turn in range(turns):
        units = random_units(rng, rng.randint(1, 4), 120)
        chunks += encode_stream(request_id, units, turn, shape, duplex_turn_id=turn)
    return chunks


def interleave(rng: random.Random, streams: Sequence[Sequence[CodecChunk]]) -> list[CodecChunk]:
    """A uniformly random merge of the streams that keeps each stream's own order."""
    order = [index for index, stream in enumerate(streams) for _ in stream]
    rng.shuffle(order)
    cursors = [0] * len(streams)
    merged: list[CodecChunk] = []
    for index in order:
        merged.append(streams[index][cursors[index]])
        cursors[index] += 1
    return merged


def preroll_window(request_id: str, new_ids: Sequence[int], **fields: Any) -> CodecChunk:
    """A first window as the producer opens a stream: 3 silence ids of pre-roll context, then
    `new_ids`, its counts (numel, new frames, context frames) to match; `fields` set the rest."""
    codes = (SILENCE_CODE,) * 3 + tuple(new_ids)
    return CodecChunk(
        request_id,
        codes,
        code_flat_numel=len(codes),
        codec_chunk_frames=len(new_ids),
        codec_left_context_frames=3,
        **fields,
    )


def realistic_events(rng: random.Random, sessions: int, turns: int = 3) -> list[CodecChunk]:
    """`sessions` interleaved duplex sessions of `turns` turns (about 10 chunks per turn)."""
    streams = [session_stream(rng, f"session-{index:05d}", turns) for index in range(sessions)]
    return interleave(rng, streams)
