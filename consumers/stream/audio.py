"""The audio a decode window becomes (an AudioChunk), and per-request audio accounting for
reports (every window, a running hash, optional PCM)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from codeclog.consumers.stream.fold.outcomes import Decode
from codeclog.schemas.records import SAMPLE_RATE_HZ, AudioChunk


def audio_chunk(
    decode: Decode,
    window_index: int,
    sample_offset: int,
    pcm: bytes,
    producer_id: str,
    domain: str,
) -> AudioChunk:
    """The record of one decoded window: its PCM, where it sits in its stream, and the echo of
    the codec chunks it came from."""
    return AudioChunk(
        request_id=decode.request_id,
        cache_epoch=decode.cache_epoch,
        chunk_seqs=decode.chunk_seqs,
        window_index=window_index,
        sample_offset=sample_offset,
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
        producer_id=producer_id,
        determinism_domain=domain,
    )


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
