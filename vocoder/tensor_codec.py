"""The one tensor <-> bytes codec of the vocoder's serialised states (flow and stream states).

A tensor is stored as its raw bytes (row-major, the machine's byte order: little-endian on x86-64
and ARM64) plus a spec `{"dtype", "shape", "nbytes"}` that the caller keeps in its JSON header.
Decoding refuses any blob its spec does not describe (`TensorCodecError`, a ValueError the
callers turn into their own typed errors).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor


class TensorCodecError(ValueError):
    """A blob does not match its spec (unknown dtype, wrong length, impossible shape)."""


def tensor_bytes(tensor: Tensor) -> bytes:
    """The raw bytes of `tensor` (on any device; copied to the host)."""
    if tensor.numel() == 0:  # an empty view may carry stride 0, which .view(uint8) refuses
        return b""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def tensor_spec(tensor: Tensor, nbytes: int) -> dict[str, object]:
    """The header entry that `tensor_from_bytes` needs to rebuild `tensor`."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    return {"dtype": dtype, "shape": list(tensor.shape), "nbytes": nbytes}


def tensor_from_bytes(blob: bytes, spec: Mapping[str, object]) -> Tensor:
    """The CPU tensor that `tensor_bytes` wrote, as described by `spec`."""
    dtype = getattr(torch, str(spec["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise TensorCodecError(f"unknown dtype {spec['dtype']!r}")
    if len(blob) != int(str(spec["nbytes"])):
        raise TensorCodecError("truncated tensor data")
    raw_shape = spec["shape"]
    if not isinstance(raw_shape, list):
        raise TensorCodecError("tensor shape is not a list")
    shape = [int(n) for n in raw_shape]
    raw = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else torch.empty(0)
    try:
        return raw.to(torch.uint8).view(dtype).reshape(shape)
    except RuntimeError as exc:
        raise TensorCodecError(f"tensor data does not fit shape {shape} of {dtype}") from exc
