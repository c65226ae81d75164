"""Portable reductions: softmax, layer norm, norms, sums, means and cumsum as fixed-order
pairwise sums in float64 (docs/determinism.md, "Portable kernels")."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from codeclog.vocoder.errors import PortableKernelError
from codeclog.vocoder.kernels import exactmath as em

aten = torch.ops.aten
F64 = torch.float64


def _softmax(x: Tensor, dim: int, half_to_float: bool = False, dtype: Any = None) -> Tensor:
    x64 = x.to(F64)
    shifted = x64 - x64.amax(dim=dim, keepdim=True)
    e = em.exp(shifted)
    out = e / em.tree_sum(e, dim, keepdim=True)
    target = dtype if isinstance(dtype, torch.dtype) else x.dtype
    return out.to(target)


def _layer_norm(
    x: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    *_: Any,
) -> Tensor:
    return _native_layer_norm(x, normalized_shape, weight, bias, eps)[0]


def _native_layer_norm(
    x: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    dims = len(normalized_shape)
    flat = x.to(F64).flatten(start_dim=x.dim() - dims)
    count = flat.shape[-1]
    mean = em.tree_sum(flat, -1, keepdim=True) / count
    centred = flat - mean
    variance = em.tree_sum(centred * centred, -1, keepdim=True) / count
    rstd = 1.0 / torch.sqrt(variance + eps)
    out = (centred * rstd).reshape(x.shape)
    if weight is not None:
        out = out * weight.to(F64)
    if bias is not None:
        out = out + bias.to(F64)
    stat_shape = list(x.shape[: x.dim() - dims]) + [1] * dims
    return (
        out.to(x.dtype),
        mean.reshape(stat_shape).to(x.dtype),
        rstd.reshape(stat_shape).to(x.dtype),
    )


def _vector_norm(
    x: Tensor, ord: float = 2, dim: Any = None, keepdim: bool = False, *, dtype: Any = None
) -> Tensor:
    if ord != 2:
        raise PortableKernelError(f"vector_norm(ord={ord}) has no portable kernel")
    x64 = x.to(F64)
    dims = list(range(x.dim())) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    squares = x64 * x64
    for d in sorted((d % x.dim() for d in dims), reverse=True):
        squares = em.tree_sum(squares, d, keepdim=keepdim)
    return torch.sqrt(squares).to(dtype if isinstance(dtype, torch.dtype) else x.dtype)


def _sum(x: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    if not x.is_floating_point():
        return torch.sum(x, dim=dim, keepdim=keepdim, dtype=dtype)
    x64 = x.to(F64)
    dims = list(range(x.dim())) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    for d in sorted((d % x.dim() for d in dims), reverse=True):
        x64 = em.tree_sum(x64, d, keepdim=keepdim)
    return x64.to(dtype if isinstance(dtype, torch.dtype) else x.dtype)


def _mean(x: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    dims = list(range(x.dim())) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    count = math.prod(x.shape[d] for d in dims)
    total = _sum(x, dims, keepdim, dtype=F64)
    return (total / count).to(dtype if isinstance(dtype, torch.dtype) else x.dtype)


def _cumsum(x: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    if not x.is_floating_point():
        return torch.cumsum(x, dim, dtype=dtype)
    return em.exact_cumsum(x, dim).to(dtype if isinstance(dtype, torch.dtype) else x.dtype)


HANDLERS: dict[Any, Callable[..., Any]] = {
    aten.softmax.int: _softmax,
    aten._softmax.default: _softmax,
    aten.layer_norm.default: _layer_norm,
    aten.native_layer_norm.default: _native_layer_norm,
    aten.linalg_vector_norm.default: _vector_norm,
    aten.sum.dim_IntList: _sum,
    aten.sum.default: _sum,
    aten.mean.dim: _mean,
    aten.mean.default: _mean,
    aten.cumsum.default: _cumsum,
}
