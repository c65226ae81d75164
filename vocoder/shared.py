"""The vocoder's torch-free helpers, shared with the consumer pipeline (which must not import
torch): stream seeds derived from stream identity, and the float -> PCM conversion.

`domain_hift_variant` reads the HiFT variant from a determinism domain string (vocoder.domain
appends `:causal` for the causal HiFT), so the consumer can refuse to continue a stream in an
engine of the other variant without importing torch.

`thread_setting` scopes a per-thread setting (the flow's tiled GEMMs, the ragged HiFT's rows)
to a block.

`stream_seed` is a pure function of (request id, cache epoch), stable across processes, machines
and Python hash seeds (sha256, not `hash()`); `window_seed` derives the HiFT noise seed of one
decode window from it. Live and offline decodes both call these, so their audio is identical.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

_SEED_MASK = (1 << 63) - 1  # torch seeds are unsigned 64-bit; stay in the signed range too


def _digest_seed(*parts: bytes) -> int:
    digest = hashlib.sha256(b"\x00".join(parts)).digest()
    return int.from_bytes(digest[:8], "big") & _SEED_MASK


def stream_seed(request_id: str, cache_epoch: int) -> int:
    """The seed of one (request, epoch) stream: same inputs, same seed, in every process."""
    return _digest_seed(b"codeclog.stream.v1", request_id.encode(), str(cache_epoch).encode())


def window_seed(seed: int, window_index: int) -> int:
    """The seed of the HiFT noise of window `window_index` of the stream seeded `seed`."""
    return _digest_seed(b"codeclog.window.v1", str(seed).encode(), str(window_index).encode())


CAUSAL_DOMAIN_TAG = "causal"  # vocoder.domain.engine_domain_suffix's tag of the causal HiFT


def domain_hift_variant(domain: str) -> str:
    """ "causal" or "noncausal": the HiFT variant of the engine that wrote `domain`."""
    return "causal" if CAUSAL_DOMAIN_TAG in domain.split(":") else "noncausal"


def pcm_s16le(audio: np.ndarray) -> bytes:
    """Float audio to 16-bit little-endian PCM exactly as upstream `Token2wav.stream` does:
    clip to [-1, 1], scale by 32767, truncate toward zero."""
    clipped = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
    return (clipped * 32767.0).astype("<i2").tobytes()


@contextlib.contextmanager
def thread_setting(local: threading.local, name: str, value: Any) -> Iterator[None]:
    """`local.<name>` is `value` in this thread while the block runs, then what it was
    (re-entrant; other threads never see it)."""
    before = getattr(local, name, None)
    setattr(local, name, value)
    try:
        yield
    finally:
        setattr(local, name, before)
