"""A request's audio for the report: a WAV to play inline and the peaks its waveform draws."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io

import numpy as np

from codeclog.replay.wav import write_wav
from codeclog.schemas.records import SAMPLE_RATE_HZ

PEAK_BUCKETS = 800  # columns of the drawn waveform, whatever the audio's length
FULL_SCALE = 32768.0


@dataclasses.dataclass(frozen=True)
class Clip:
    seconds: float
    sha256: str  # of the 16-bit PCM, as the replay report's audio digest
    wav_base64: str  # a 24 kHz mono 16-bit WAV
    peaks: list[tuple[float, float]]  # per column (min, max) in -1..1


def clip_of(pcm_s16le: bytes) -> Clip:
    buffer = io.BytesIO()
    write_wav(buffer, pcm_s16le)
    return Clip(
        seconds=round(len(pcm_s16le) / 2 / SAMPLE_RATE_HZ, 3),
        sha256=hashlib.sha256(pcm_s16le).hexdigest(),
        wav_base64=base64.b64encode(buffer.getvalue()).decode("ascii"),
        peaks=peaks(pcm_s16le),
    )


def peaks(pcm_s16le: bytes, buckets: int = PEAK_BUCKETS) -> list[tuple[float, float]]:
    """The lowest and highest sample of each of `buckets` equal slices (fewer for short audio),
    scaled to -1..1 and rounded to 3 digits: enough for a drawing, small in the page."""
    samples = np.frombuffer(pcm_s16le[: len(pcm_s16le) // 2 * 2], dtype="<i2")
    if samples.size == 0:
        return []
    slices = np.array_split(samples, min(buckets, samples.size))
    return [
        (round(float(part.min()) / FULL_SCALE, 3), round(float(part.max()) / FULL_SCALE, 3))
        for part in slices
    ]
