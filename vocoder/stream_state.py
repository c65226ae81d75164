"""The per-request stream state of the Code2Wav engine: one frozen value and its exact bytes.

A `StreamState` is everything one (request, epoch) stream carries from a window to the next:
the flow caches (a `FlowState`), the HiFT caches (held mel, excitation and samples), the stream
seed and the counters. The caller owns it; the engine never mutates one. `to_bytes` /
`from_bytes` are exact and self-describing (format v1: magic, version, a JSON header, the HiFT
tensors, then `FlowState.to_bytes()`), through the one tensor codec of `vocoder.tensor_codec`.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Hashable

import torch
from torch import Tensor

from codeclog.vocoder.errors import StreamStateError
from codeclog.vocoder.flow import FlowState, FlowStateError
from codeclog.vocoder.hift import HiftCache
from codeclog.vocoder.tensor_codec import tensor_bytes, tensor_from_bytes, tensor_spec

__all__ = ["StreamState", "StreamStateError"]

_MAGIC = b"CCSTREAM"
_FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sHII")  # magic, version, JSON header length, flow blob length
_HIFT_FIELDS = ("hift_mel", "hift_source", "hift_speech")


@dataclasses.dataclass(frozen=True, eq=False)
class StreamState:
    """Everything one (request, epoch) stream carries from a window to the next."""

    flow: FlowState  # flow caches (conformer + DiT), speaker vector, prompt length
    hift_mel: Tensor  # (80, M<=8) mel frames re-vocoded with the next window
    hift_source: Tensor  # (M*480,) NSF excitation of those frames
    hift_speech: Tensor  # (M*480,) held-back samples, cross-faded with the next window
    seed: int  # the stream seed (see stream_seed); HiFT noise derives from it per window
    window_index: int  # windows decoded so far
    samples_emitted: int  # samples returned so far (the sample offset of the next audio)
    voice_id: str  # the voice whose prompt state the stream started from

    @property
    def finished(self) -> bool:
        """The final window was decoded; the stream cannot continue."""
        return bool(self.flow.finished)

    @property
    def held_samples(self) -> int:
        return int(self.hift_speech.shape[0])

    @property
    def nbytes(self) -> int:
        hift = sum(int(getattr(self, name).nbytes) for name in _HIFT_FIELDS)
        return int(self.flow.nbytes) + hift

    def hift_cache(self) -> HiftCache:
        return HiftCache(self.hift_mel, self.hift_source, self.hift_speech)

    def signature(self) -> Hashable:
        """States with equal signatures (and equal windows) run in one exact batch."""
        return (self.flow.shape_signature(), self.hift_cache().signature())

    def to(self, device: torch.device | str) -> StreamState:
        moved = {name: getattr(self, name).to(device) for name in _HIFT_FIELDS}
        return dataclasses.replace(self, flow=self.flow.to(device), **moved)

    def to_bytes(self) -> bytes:
        """Exact, self-describing bytes: header, HiFT tensors, then FlowState.to_bytes()."""
        blobs = [tensor_bytes(getattr(self, name)) for name in _HIFT_FIELDS]
        header = {
            "seed": self.seed,
            "window_index": self.window_index,
            "samples_emitted": self.samples_emitted,
            "voice_id": self.voice_id,
            "tensors": [
                tensor_spec(getattr(self, n), len(b))
                for n, b in zip(_HIFT_FIELDS, blobs, strict=True)
            ],
        }
        encoded = json.dumps(header, sort_keys=True).encode()
        flow = self.flow.to_bytes()
        head = _HEADER.pack(_MAGIC, _FORMAT_VERSION, len(encoded), len(flow))
        return b"".join([head, encoded, *blobs, flow])

    @classmethod
    def from_bytes(cls, data: bytes) -> StreamState:
        """The inverse of to_bytes; tensors land on the CPU (the engine moves them).
        Raises StreamStateError for bytes that are not an intact stream state."""
        try:
            return cls._parse(data)
        except (KeyError, TypeError, ValueError, RuntimeError, struct.error) as exc:
            raise StreamStateError(f"stream state bytes are corrupt: {exc}") from exc
        except FlowStateError as exc:
            raise StreamStateError(f"stream state bytes: {exc}") from exc

    @classmethod
    def _parse(cls, data: bytes) -> StreamState:
        magic, version, header_len, flow_len = _HEADER.unpack_from(data)
        if magic != _MAGIC or version != _FORMAT_VERSION:
            raise StreamStateError("stream state bytes: not a codeclog stream state v1")
        start = _HEADER.size
        header = json.loads(data[start : start + header_len])
        position = start + header_len
        tensors: dict[str, Tensor] = {}
        for name, spec in zip(_HIFT_FIELDS, header["tensors"], strict=True):
            size = int(spec["nbytes"])
            tensors[name] = tensor_from_bytes(data[position : position + size], spec)
            position += size
        if len(data) - position != flow_len:
            raise StreamStateError("stream state bytes: truncated")
        return cls(
            flow=FlowState.from_bytes(data[position:]),
            seed=int(header["seed"]),
            window_index=int(header["window_index"]),
            samples_emitted=int(header["samples_emitted"]),
            voice_id=str(header["voice_id"]),
            **tensors,
        )
