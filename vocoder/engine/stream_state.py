"""`StreamState`: everything one stream carries from a window to the next, as one frozen value,
and its exact bytes (docs/vocoder.md, "A stream's state")."""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Hashable
from typing import Any

import torch
from torch import Tensor

from codeclog.vocoder.errors import StreamStateError
from codeclog.vocoder.flow import FlowState, FlowStateError
from codeclog.vocoder.hift.causal_stream import CausalHiftCache
from codeclog.vocoder.hift.noncausal_stream import HiftCache
from codeclog.vocoder.tensor_codec import tensor_bytes, tensor_from_bytes, tensor_spec

__all__ = ["StreamState", "StreamStateError"]

_MAGIC = b"CCSTREAM"
_FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sHII")  # magic, version, JSON header length, flow blob length
_HIFT_FIELDS = ("mel", "source", "speech")  # HiftCache's tensors (scheme A)
_CAUSAL_FIELDS = ("mel", "source", "phase")  # CausalHiftCache's tensors (scheme B)
_CAUSAL_COUNTERS = ("mel_offset", "source_offset", "source_end", "emitted")
NONCAUSAL = "noncausal"
CAUSAL = "causal"
HiftState = HiftCache | CausalHiftCache


@dataclasses.dataclass(frozen=True, eq=False)
class StreamState:
    """Everything one (request, epoch) stream carries from a window to the next."""

    flow: FlowState  # flow caches (conformer + DiT), speaker vector, prompt length
    hift: HiftState  # scheme A: the cross-fade caches; scheme B: the causal HiFT's history
    seed: int  # the stream seed (see stream_seed); HiFT noise derives from it per window
    window_index: int  # windows decoded so far
    samples_emitted: int  # samples returned so far (the sample offset of the next audio)
    voice_id: str  # the voice whose prompt state the stream started from

    @property
    def hift_variant(self) -> str:
        """ "causal" (scheme B) or "noncausal" (scheme A): which HiFT engine can continue it."""
        return CAUSAL if isinstance(self.hift, CausalHiftCache) else NONCAUSAL

    @property
    def finished(self) -> bool:
        """The final window was decoded; the stream cannot continue."""
        return bool(self.flow.finished)

    @property
    def hift_mel(self) -> Tensor:
        """(80, M): the mel frames the HiFT state holds."""
        return self.hift.mel

    @property
    def held_samples(self) -> int:
        """Scheme A: samples held back for the cross-fade. Scheme B: samples still owed for
        frames received but not yet vocoded (the fixed delay)."""
        if isinstance(self.hift, CausalHiftCache):
            return 0 if self.finished else (self.hift.received - self.hift.emitted) * 480
        return int(self.hift.speech.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.flow.nbytes) + sum(int(t.nbytes) for t in self._tensors())

    def hift_cache(self) -> HiftState:
        return self.hift

    def signature(self) -> Hashable:
        """States with equal signatures (and equal windows) run in one exact batch; states of
        the two HiFT variants never do."""
        hift = self.hift
        if isinstance(hift, CausalHiftCache):
            shape = (int(hift.mel.shape[1]), int(hift.source.shape[0]), hift.started)
            return (self.flow.shape_signature(), CAUSAL, shape)
        return (self.flow.shape_signature(), NONCAUSAL, hift.signature())

    def _tensors(self) -> list[Tensor]:
        names = _CAUSAL_FIELDS if isinstance(self.hift, CausalHiftCache) else _HIFT_FIELDS
        return [getattr(self.hift, name) for name in names]

    def to(self, device: torch.device | str) -> StreamState:
        hift = self.hift
        names = _CAUSAL_FIELDS if isinstance(hift, CausalHiftCache) else _HIFT_FIELDS
        moved = {name: getattr(hift, name).to(device) for name in names}
        return dataclasses.replace(
            self, flow=self.flow.to(device), hift=dataclasses.replace(hift, **moved)
        )

    def to_bytes(self) -> bytes:
        """Exact, self-describing bytes: header, HiFT tensors, then FlowState.to_bytes()."""
        tensors = self._tensors()
        blobs = [tensor_bytes(tensor) for tensor in tensors]
        header: dict[str, Any] = {
            "seed": self.seed,
            "window_index": self.window_index,
            "samples_emitted": self.samples_emitted,
            "voice_id": self.voice_id,
            "tensors": [tensor_spec(t, len(b)) for t, b in zip(tensors, blobs, strict=True)],
        }
        if isinstance(self.hift, CausalHiftCache):
            header["hift"] = CAUSAL
            header["causal"] = {name: getattr(self.hift, name) for name in _CAUSAL_COUNTERS}
            header["causal"].update(started=self.hift.started, finalized=self.hift.finalized)
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
        variant = header.get("hift", NONCAUSAL)
        if variant not in (CAUSAL, NONCAUSAL):
            raise StreamStateError(f"stream state bytes: unknown HiFT variant {variant!r}")
        names = _CAUSAL_FIELDS if variant == CAUSAL else _HIFT_FIELDS
        tensors: dict[str, Tensor] = {}
        for name, spec in zip(names, header["tensors"], strict=True):
            size = int(spec["nbytes"])
            tensors[name] = tensor_from_bytes(data[position : position + size], spec)
            position += size
        if len(data) - position != flow_len:
            raise StreamStateError("stream state bytes: truncated")
        hift: HiftState
        if variant == CAUSAL:
            raw = header["causal"]
            hift = CausalHiftCache(
                mel=tensors["mel"],
                source=tensors["source"],
                phase=tensors["phase"],
                mel_offset=int(raw["mel_offset"]),
                source_offset=int(raw["source_offset"]),
                source_end=int(raw["source_end"]),
                emitted=int(raw["emitted"]),
                started=bool(raw["started"]),
                finalized=bool(raw["finalized"]),
            )
        else:
            hift = HiftCache(**tensors)
        return cls(
            flow=FlowState.from_bytes(data[position:]),
            hift=hift,
            seed=int(header["seed"]),
            window_index=int(header["window_index"]),
            samples_emitted=int(header["samples_emitted"]),
            voice_id=str(header["voice_id"]),
        )
