"""Portable elementwise ops: each output element from one or two input elements, computed in
float64 and rounded once to the caller's dtype (docs/determinism.md, "Portable kernels")."""

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
Handler = Callable[..., Any]


def _alpha_free(op: Handler) -> Handler:
    """add/sub with alpha: a (+/-) alpha * b as two rounded ops (natively one fused op on some
    CPUs); alpha 1 is already exact."""

    def run(a: Any, b: Any, alpha: float = 1) -> Tensor:
        if alpha != 1:
            b = b * alpha
        return op(a, b)

    return run


def _add_inplace(a: Tensor, b: Any, alpha: float = 1) -> Tensor:
    return a.copy_(a + (b * alpha if alpha != 1 else b))


def _rsub(a: Tensor, other: Any, alpha: float = 1) -> Tensor:
    return other - (a * alpha if alpha != 1 else a)


def _unary(fn: Callable[[Tensor], Tensor]) -> Handler:
    def run(x: Tensor) -> Tensor:
        return fn(x.to(F64)).to(x.dtype)

    return run


def _pow(x: Tensor, exponent: float) -> Tensor:
    if exponent == 2:
        return x * x
    if exponent == 1:
        return x.clone()
    if exponent == 0.5:
        return torch.sqrt(x)
    if float(exponent).is_integer() and abs(exponent) <= 8:
        result = torch.ones_like(x)
        for _ in range(int(abs(exponent))):
            result = result * x
        return result if exponent > 0 else 1.0 / result
    x64 = x.to(F64)
    return em.exp(em.log(x64) * float(exponent)).to(x.dtype)


def _gelu(x: Tensor, approximate: str = "none") -> Tensor:
    if approximate != "tanh":
        raise PortableKernelError("gelu(approximate='none') has no portable kernel (erf)")
    x64 = x.to(F64)
    inner = (x64 + x64 * x64 * x64 * 0.044715) * math.sqrt(2.0 / math.pi)
    return (x64 * 0.5 * (em.tanh(inner) + 1.0)).to(x.dtype)


def _silu(x: Tensor) -> Tensor:
    x64 = x.to(F64)
    return (x64 * em.sigmoid(x64)).to(x.dtype)


def _mish(x: Tensor) -> Tensor:
    """x * tanh(softplus(x)) = x * n / (n + 2) with n = e^x (e^x + 2): no log needed."""
    x64 = x.to(F64)
    e = em.exp(x64.clamp(max=20.0))
    n = e * (e + 2.0)
    return (x64 * (n / (n + 2.0))).to(x.dtype)


def _elu(x: Tensor, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Tensor:
    x64 = x.to(F64)
    negative = em.expm1(x64 * input_scale) * alpha
    return (torch.where(x64 > 0, x64, negative) * scale).to(x.dtype)


def _upsample_linear1d(
    x: Tensor,
    output_size: Any,
    align_corners: bool,
    scale_factors: Any,
    size_out: int | None = None,
) -> Tensor:
    """torch's coordinate mapping (area_pixel_compute_source_index), in float64."""
    size_in = x.shape[-1]
    scale: float | None = None
    if output_size is not None:
        size_out = int(output_size[0])
    else:
        factor = float(scale_factors[0])
        size_out = math.floor(size_in * factor) if size_out is None else size_out
        scale = float(torch.tensor(1.0 / factor, dtype=torch.float32))
    if align_corners:
        ratio = (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
        source = torch.arange(size_out, dtype=F64) * ratio
    else:
        ratio = scale if scale is not None else size_in / size_out
        source = ((torch.arange(size_out, dtype=F64) + 0.5) * ratio - 0.5).clamp(min=0.0)
    low = torch.floor(source).to(torch.int64).clamp(max=size_in - 1)
    high = torch.clamp(low + 1, max=size_in - 1)
    weight_high = source - low.to(F64)
    x64 = x.to(F64)
    out = x64[..., low] * (1.0 - weight_high) + x64[..., high] * weight_high
    return out.to(x.dtype)


def _upsample_linear1d_sizes(
    x: Tensor, output_size: Sequence[int], align_corners: bool, scales: float | None = None
) -> Tensor:
    """The overload with an explicit output size (and the scale it came from, if any)."""
    if scales is None or scales <= 0:
        return _upsample_linear1d(x, output_size, align_corners, None)
    return _upsample_linear1d(x, None, align_corners, [scales], size_out=int(output_size[0]))


HANDLERS: dict[Any, Handler] = {
    aten.add.Tensor: _alpha_free(torch.add),
    aten.add.Scalar: _alpha_free(torch.add),
    aten.sub.Tensor: _alpha_free(torch.sub),
    aten.sub.Scalar: _alpha_free(torch.sub),
    aten.add_.Tensor: _add_inplace,
    aten.rsub.Scalar: _rsub,
    aten.rsub.Tensor: _rsub,
    aten.pow.Tensor_Scalar: _pow,
    aten.exp.default: _unary(em.exp),
    aten.expm1.default: _unary(em.expm1),
    aten.log.default: _unary(em.log),
    aten.sin.default: _unary(em.sin),
    aten.cos.default: _unary(em.cos),
    aten.tanh.default: _unary(em.tanh),
    aten.sigmoid.default: _unary(em.sigmoid),
    aten.rsqrt.default: lambda x: 1.0 / torch.sqrt(x),
    aten.gelu.default: _gelu,
    aten.silu.default: _silu,
    aten.mish.default: _mish,
    aten.elu.default: _elu,
    aten.upsample_linear1d.vec: _upsample_linear1d,
    aten.upsample_linear1d.default: _upsample_linear1d_sizes,
}
