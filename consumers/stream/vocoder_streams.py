"""The vocoder side of the pipeline: one vocoder stream per request's open epoch, making its
windows' AudioChunks (`VocoderStream.emit`), and a batched decode that retries a failing batch
one window at a time, so a window that fails alone costs only its own request."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from codeclog.consumers.stream.audio import audio_chunk
from codeclog.consumers.stream.engine import VocoderEngine
from codeclog.consumers.stream.fold.outcomes import Decode
from codeclog.schemas.records import AudioChunk
from codeclog.vocoder.shared import pcm_s16le, stream_seed

Item = tuple[Any, Sequence[int], bool]  # (vocoder state, codes, final): one decode_batch item
Result = tuple[np.ndarray, Any]  # (samples, new vocoder state)


@dataclasses.dataclass(slots=True)
class VocoderStream:
    """The vocoder side of one request's open epoch."""

    cache_epoch: int
    state: Any
    window_index: int = 0
    samples_emitted: int = 0

    def emit(self, decode: Decode, result: Result, producer_id: str, domain: str) -> AudioChunk:
        """The AudioChunk of the stream's next window, `decode` decoded to `result`: the
        stream takes the new vocoder state and moves past the window."""
        samples, self.state = result
        pcm = pcm_s16le(samples)
        chunk = audio_chunk(
            decode, self.window_index, self.samples_emitted, pcm, producer_id, domain
        )
        self.window_index += 1
        self.samples_emitted += len(pcm) // 2
        return chunk


class VocoderStreams:
    """The open vocoder streams by request id, over one engine (None: nothing is decoded)."""

    def __init__(self, engine: VocoderEngine | None) -> None:
        self.engine = engine
        self._streams: dict[str, VocoderStream] = {}

    def get(self, rid: str) -> VocoderStream | None:
        return self._streams.get(rid)

    def for_window(self, decode: Decode) -> VocoderStream:
        """The stream of the window's epoch; a new one (seeded per request and epoch) replaces
        a stream of another epoch."""
        assert self.engine is not None
        rid = decode.request_id
        stream = self._streams.get(rid)
        if stream is None or stream.cache_epoch != decode.cache_epoch:
            self.drop(rid)
            state = self.engine.setup(seed=stream_seed(rid, decode.cache_epoch))
            stream = self._streams[rid] = VocoderStream(decode.cache_epoch, state)
        return stream

    def end_epoch(self, rid: str, epoch: int | None) -> None:
        """Drop the request's stream if it is of this epoch."""
        stream = self._streams.get(rid)
        if stream is not None and stream.cache_epoch == epoch:
            self.drop(rid)

    def drop(self, rid: str) -> None:
        stream = self._streams.pop(rid, None)
        if stream is not None and self.engine is not None:
            self.engine.release(stream.state)

    def adopt(self, other: VocoderStreams, rid: str) -> bool:
        """Take over `other`'s stream of this request, if it has one (recovery)."""
        stream = other._streams.pop(rid, None)
        if stream is None:
            return False
        self.drop(rid)
        self._streams[rid] = stream
        return True

    def decode(self, items: list[Item]) -> list[Result | Exception]:
        """One decode_batch call; if it fails, each item alone (its own error, or its result)."""
        assert self.engine is not None
        try:
            return list(self.engine.decode_batch(items))
        except Exception:  # isolate the failing item: retry each alone
            if len(items) == 1:
                return [self._solo(items[0])]
            return [self._solo(item) for item in items]

    def _solo(self, item: Item) -> Result | Exception:
        assert self.engine is not None
        try:
            return self.engine.decode_batch([item])[0]
        except Exception as exc:  # a vocoder failure costs only this request
            return exc
