"""The per-request flow state: one frozen, serialisable value, stacked into a batch and split
back (docs/vocoder.md, "The flow")."""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from codeclog.vocoder.flow.config import ConformerTrim, FlowConfig
from codeclog.vocoder.flow.errors import FlowStateError
from codeclog.vocoder.tensor_codec import (
    TensorCodecError,
    tensor_bytes,
    tensor_from_bytes,
    tensor_spec,
)

TENSOR_FIELDS = (
    "conformer_cnn_cache",
    "conformer_att_cache",
    "estimator_cnn_cache",
    "estimator_att_cache",
    "spk",
)
INT_FIELDS = ("prompt_frames", "chunks_done")
MAGIC = b"CCFLOWST"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sHI")  # magic, format version, JSON header length


@dataclasses.dataclass(frozen=True, eq=False)
class FlowState:
    """Everything the flow carries from one window of a request to the next.

    Shapes in the field comments: C = conformer width, L = conformer layers (token-rate then
    mel-rate), T = cached mel frames, n_t = Euler steps, hd = DiT head width. States are values:
    the flow never mutates one, so a prompt state can be shared by every stream of a voice.
    """

    conformer_cnn_cache: Tensor  # (C, 2 + 2 * ratio): pre-lookahead conv2 + upsample conv
    conformer_att_cache: Tensor  # (L, heads, T, 2 d_k): token layers packed x ratio, oldest first
    estimator_cnn_cache: Tensor  # (n_t, depth, 2 [cond, uncond], 2 * hidden, 2)
    estimator_att_cache: Tensor  # (n_t, depth, 2 [cond, uncond], heads, T, 2 hd), newest first
    spk: Tensor  # (mel_dim,): the speaker vector after normalise + projection
    prompt_frames: int  # P, the prompt's mel frames (2 x prompt tokens); trimming keeps them
    chunks_done: int  # windows decoded since the prompt setup
    finished: bool = False  # the final window was decoded; the stream cannot continue

    @property
    def noise_offset(self) -> int:
        """Where the next window reads the noise table (upstream: the att cache length)."""
        return int(self.estimator_att_cache.shape[4])

    @property
    def nbytes(self) -> int:
        return sum(_tensor(self, name).nbytes for name in TENSOR_FIELDS)

    def shape_signature(self) -> tuple[object, ...]:
        """States with equal signatures can be stacked into one batch."""
        shapes = tuple(tuple(_tensor(self, name).shape) for name in TENSOR_FIELDS)
        tensor = self.estimator_att_cache
        return (self.prompt_frames, self.finished, str(tensor.dtype), str(tensor.device), shapes)

    def to(self, device: torch.device | str) -> FlowState:
        return dataclasses.replace(
            self,
            conformer_cnn_cache=self.conformer_cnn_cache.to(device),
            conformer_att_cache=self.conformer_att_cache.to(device),
            estimator_cnn_cache=self.estimator_cnn_cache.to(device),
            estimator_att_cache=self.estimator_att_cache.to(device),
            spk=self.spk.to(device),
        )

    def to_bytes(self) -> bytes:
        """Exact, self-describing bytes: a JSON header, then each tensor's raw bytes in the
        machine's byte order (little-endian on x86-64 and ARM64)."""
        blobs = [tensor_bytes(_tensor(self, name)) for name in TENSOR_FIELDS]
        header = {
            "ints": {name: getattr(self, name) for name in INT_FIELDS},
            "finished": self.finished,
            "tensors": [
                {"name": name, **tensor_spec(_tensor(self, name), len(blob))}
                for name, blob in zip(TENSOR_FIELDS, blobs, strict=True)
            ],
        }
        encoded = json.dumps(header, sort_keys=True).encode()
        return b"".join([_HEADER.pack(MAGIC, FORMAT_VERSION, len(encoded)), encoded, *blobs])

    @classmethod
    def from_bytes(cls, data: bytes) -> FlowState:
        """The inverse of `to_bytes`; tensors land on the CPU (use `.to(device)`)."""
        header, body = _split_header(data)
        try:
            return _decode(cls, header, body)
        except (KeyError, TypeError, ValueError) as exc:
            raise FlowStateError(f"flow state bytes: malformed header ({exc!r})") from exc


def _decode(cls: type[FlowState], header: dict[str, Any], body: bytes) -> FlowState:
    tensors: dict[str, Tensor] = {}
    position = 0
    for spec in header["tensors"]:
        size = int(spec["nbytes"])
        tensors[str(spec["name"])] = _from_raw(body[position : position + size], spec)
        position += size
    if position != len(body) or set(tensors) != set(TENSOR_FIELDS):
        raise FlowStateError("flow state bytes: tensor table does not match the payload")
    ints = header["ints"]
    return cls(
        conformer_cnn_cache=tensors["conformer_cnn_cache"],
        conformer_att_cache=tensors["conformer_att_cache"],
        estimator_cnn_cache=tensors["estimator_cnn_cache"],
        estimator_att_cache=tensors["estimator_att_cache"],
        spk=tensors["spk"],
        prompt_frames=int(ints["prompt_frames"]),
        chunks_done=int(ints["chunks_done"]),
        finished=bool(header["finished"]),
    )


def _tensor(state: FlowState, name: str) -> Tensor:
    value = getattr(state, name)
    assert isinstance(value, Tensor)
    return value


def _from_raw(blob: bytes, spec: dict[str, Any]) -> Tensor:
    try:
        return tensor_from_bytes(blob, spec)
    except TensorCodecError as exc:
        raise FlowStateError(f"flow state bytes: tensor {spec['name']!r}: {exc}") from exc


def _split_header(data: bytes) -> tuple[dict[str, Any], bytes]:
    if len(data) < _HEADER.size:
        raise FlowStateError("flow state bytes: too short for a header")
    magic, version, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FlowStateError("flow state bytes: bad magic (not a codeclog flow state)")
    if version != FORMAT_VERSION:
        raise FlowStateError(f"flow state bytes: format version {version} is not supported")
    start = _HEADER.size
    try:
        header = json.loads(data[start : start + length])
    except ValueError as exc:
        raise FlowStateError("flow state bytes: corrupt header") from exc
    if not isinstance(header, dict):
        raise FlowStateError("flow state bytes: corrupt header")
    return header, data[start + length :]


# Batching: per-request layouts <-> the batched layouts of the encoder and the solver.


@dataclasses.dataclass(frozen=True, eq=False)
class BatchCaches:
    """The caches of B stacked states, in the layouts the modules consume."""

    conformer_cnn: Tensor  # (B, C, 2 + 2 ratio)
    conformer_att: Tensor  # (L, B, heads, T, 2 d_k)
    estimator_cnn: Tensor  # (n_t, depth, 2B, 2 hidden, 2), [cond x B | uncond x B]
    estimator_att: Tensor  # (n_t, depth, 2B, heads, T, 2 hd)
    spk: Tensor  # (B, mel)


def stack_states(states: Sequence[FlowState], device: torch.device) -> BatchCaches:
    return BatchCaches(
        conformer_cnn=torch.stack([s.conformer_cnn_cache.to(device) for s in states]),
        conformer_att=torch.stack([s.conformer_att_cache.to(device) for s in states], dim=1),
        estimator_cnn=cfg_rows([s.estimator_cnn_cache.to(device) for s in states]),
        estimator_att=cfg_rows([s.estimator_att_cache.to(device) for s in states]),
        spk=torch.stack([s.spk.to(device) for s in states]),
    )


def cfg_rows(rows: Sequence[Tensor]) -> Tensor:
    """B estimator caches (n_t, depth, 2, ...) as the solver's (n_t, depth, 2B, ...) rows,
    [cond x B | uncond x B]."""
    if len(rows) == 1:
        return rows[0]
    return torch.cat([r[:, :, 0:1] for r in rows] + [r[:, :, 1:2] for r in rows], dim=2)


def split_caches(
    caches: BatchCaches, prompt_frames: int, chunks_done: Sequence[int], finished: bool
) -> list[FlowState]:
    """B states, each owning a copy of its rows (a view would pin the whole batch's memory).

    chunks_done holds one count per row: requests at different positions share a batch once
    their caches are trimmed to the same length."""
    count = caches.spk.shape[0]
    states = []
    for b in range(count):
        rows = [b, count + b]
        states.append(
            FlowState(
                conformer_cnn_cache=caches.conformer_cnn[b].clone(),
                conformer_att_cache=caches.conformer_att[:, b].clone(),
                estimator_cnn_cache=caches.estimator_cnn[:, :, rows],  # indexing copies
                estimator_att_cache=caches.estimator_att[:, :, rows],
                spk=caches.spk[b].clone(),
                prompt_frames=prompt_frames,
                chunks_done=chunks_done[b],
                finished=finished,
            )
        )
    return states


# Trimming (upstream Token2wav.stream, after every window).


def trim_estimator_cache(att: Tensor, prompt_frames: int, keep: int) -> Tensor:
    """Upstream: `cat(att[..., :P, :], att[..., -keep:, :])` once T > P + keep.

    The cache is newest-first, so this keeps the newest P frames and the oldest `keep` frames
    (the prompt's tail), not "prompt + last keep" as upstream's comment says. Attention here
    has no positions, so only the kept set matters; we copy upstream's slice exactly.
    """
    if att.shape[4] <= prompt_frames + keep:
        return att
    return torch.cat([att[:, :, :, :, :prompt_frames], att[:, :, :, :, -keep:]], dim=4)


def trim_conformer_cache(att: Tensor, config: FlowConfig, prompt_frames: int) -> Tensor:
    """(L, heads, T, 2 d_k), oldest first: keep the prompt and the last `keep` frames."""
    keep = config.att_keep_frames
    length = att.shape[2]
    if length <= prompt_frames + keep:
        return att
    if config.conformer_trim is ConformerTrim.PACKED:
        return torch.cat([att[:, :, :prompt_frames], att[:, :, -keep:]], dim=2)
    ratio, layers = config.token_mel_ratio, config.encoder_blocks
    tokens = att[:layers, :, : length // ratio]
    tokens = torch.cat(
        [tokens[:, :, : prompt_frames // ratio], tokens[:, :, tokens.shape[2] - keep // ratio :]],
        dim=2,
    )
    mels = torch.cat([att[layers:, :, :prompt_frames], att[layers:, :, length - keep :]], dim=2)
    return torch.cat([tokens.repeat(1, 1, ratio, 1), mels], dim=0)


def trim_state(state: FlowState, config: FlowConfig) -> FlowState:
    return dataclasses.replace(
        state,
        conformer_att_cache=trim_conformer_cache(
            state.conformer_att_cache, config, state.prompt_frames
        ),
        estimator_att_cache=trim_estimator_cache(
            state.estimator_att_cache, state.prompt_frames, config.att_keep_frames
        ),
    )
