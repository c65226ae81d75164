"""One 24 kHz mono 16-bit WAV per request (stdlib `wave`), named after the request id."""

from __future__ import annotations

import hashlib
import re
import wave
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from codeclog.schemas.records import SAMPLE_RATE_HZ
from codeclog.user_files import user_file_error

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def wav_name(request_id: str) -> str:
    """A file name for any request id; ids that need escaping get a hash suffix so two ids never
    share a file (e.g. "a/b" and "a_b")."""
    safe = _UNSAFE.sub("_", request_id)[:80]
    if safe == request_id and request_id not in ("", ".", ".."):
        return f"{safe}.wav"
    digest = hashlib.sha256(request_id.encode()).hexdigest()[:12]
    return f"{safe or 'request'}-{digest}.wav"


def write_wav(
    path: Path | BinaryIO, pcm_s16le: bytes, sample_rate_hz: int = SAMPLE_RATE_HZ
) -> None:
    """Write a WAV file at `path`, or into an open binary file (an in-memory buffer)."""
    with wave.open(str(path) if isinstance(path, Path) else path, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate_hz)
        out.writeframes(pcm_s16le)


def write_wavs(directory: Path, pcm_by_request: Mapping[str, bytes]) -> dict[str, Path]:
    """Write every request's audio; returns request id -> path, in request id order."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        written = {}
        for request_id in sorted(pcm_by_request):
            path = directory / wav_name(request_id)
            write_wav(path, pcm_by_request[request_id])
            written[request_id] = path
        return written
    except OSError as exc:
        raise user_file_error("write", "WAV files into", directory, exc) from exc
