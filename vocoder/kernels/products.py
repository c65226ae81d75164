"""Portable products: matmul, linear and the 1-D convolutions, exact whatever their summation
order (docs/determinism.md, "Portable kernels")."""

from __future__ import annotations

import functools
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from codeclog.vocoder.errors import PortableKernelError
from codeclog.vocoder.kernels import exactmath as em

aten = torch.ops.aten
F64 = torch.float64


class IntegerProducts:
    """How the exact integer-valued products are computed: float64 BLAS or int64 loops.

    Every partial sum is an integer below 2**53, so both give exactly the same result and the
    choice changes only speed: float64 BLAS is ~15x faster natively, int64 ~40x faster under
    CPU emulation (qemu-user runs MKL's FMA kernels in soft float). It is measured once per
    process; CODECLOG_PORTABLE_GEMM=float64|int64 forces one (tests check they agree).
    """

    def __init__(self, backend: str | None = None) -> None:
        chosen = backend or os.environ.get(ENV_GEMM) or _fastest_backend()
        if chosen not in ("float64", "int64"):
            raise PortableKernelError(f"{ENV_GEMM} must be float64 or int64, got {chosen!r}")
        self.backend = chosen
        self.dtype = torch.int64 if chosen == "int64" else F64

    def prepare(self, q: Tensor) -> Tensor:
        return q.to(self.dtype)

    def matmul(self, qa: Tensor, qb: Tensor) -> Tensor:
        return torch.matmul(qa.to(self.dtype), qb.to(self.dtype)).to(F64)

    def conv1d(
        self, qx: Tensor, qw: Tensor, stride: Any, padding: Any, dilation: Any, groups: int
    ) -> Tensor:
        if self.backend == "float64" or isinstance(padding, str):
            return F.conv1d(qx.to(F64), qw.to(F64), None, stride, padding, dilation, groups)
        return _conv1d_by_matmul(qx.to(self.dtype), qw, _one(stride), _one(padding),
                                 _one(dilation), groups, self.matmul)  # fmt: skip

    def conv_transpose1d(
        self,
        qx: Tensor,
        qw: Tensor,
        stride: Any,
        padding: Any,
        output_padding: Any,
        groups: int,
        dilation: Any,
    ) -> Tensor:
        if self.backend == "float64":
            return F.conv_transpose1d(
                qx.to(F64), qw.to(F64), None, stride, padding, output_padding, groups, dilation
            )
        s, p, op, d = _one(stride), _one(padding), _one(output_padding), _one(dilation)
        return _conv_transpose1d_by_matmul(qx.to(self.dtype), qw, s, p, op, d, groups, self.matmul)


ENV_GEMM = "CODECLOG_PORTABLE_GEMM"


def _one(value: Any) -> int:
    return int(value[0]) if isinstance(value, (list, tuple)) else int(value)


@functools.cache
def _fastest_backend() -> str:
    probe = torch.arange(64 * 64, dtype=F64).reshape(64, 64) % 1021
    timings = {}
    for dtype, name in ((F64, "float64"), (torch.int64, "int64")):
        operand = probe.to(dtype)
        start = time.perf_counter()
        for _ in range(3):
            torch.matmul(operand, operand)
        timings[name] = time.perf_counter() - start
    return min(timings, key=timings.__getitem__)


def _conv1d_by_matmul(
    x: Tensor,
    w: Tensor,
    stride: int,
    padding: int,
    dilation: int,
    groups: int,
    matmul: Callable[[Tensor, Tensor], Tensor],
) -> Tensor:
    """conv1d as patches @ weights (im2col), for integer operands."""
    batch = x.shape[0]
    cout, cin_group, kernel = w.shape
    padded = F.pad(x, (padding, padding)) if padding else x
    span = dilation * (kernel - 1) + 1
    patches = padded.unfold(2, span, stride)[..., ::dilation]  # (B, Cin, Tout, k)
    frames = patches.shape[2]
    patches = patches.reshape(batch, groups, cin_group, frames, kernel).permute(0, 1, 3, 2, 4)
    patches = patches.reshape(batch, groups, frames, cin_group * kernel)
    weights = w.reshape(groups, cout // groups, cin_group * kernel).transpose(1, 2)
    out = matmul(patches, weights[None])  # (B, g, Tout, Cout / g)
    return out.permute(0, 1, 3, 2).reshape(batch, cout, frames)


def _conv_transpose1d_by_matmul(
    x: Tensor,
    w: Tensor,
    stride: int,
    padding: int,
    output_padding: int,
    dilation: int,
    groups: int,
    matmul: Callable[[Tensor, Tensor], Tensor],
) -> Tensor:
    """conv_transpose1d as a conv1d over the zero-stuffed input with the flipped kernel."""
    batch, cin, length = x.shape
    _, cout_group, kernel = w.shape
    stuffed = x.new_zeros(batch, cin, (length - 1) * stride + 1)
    stuffed[..., ::stride] = x
    edge = dilation * (kernel - 1) - padding
    left, right = edge, edge + output_padding
    stuffed = F.pad(stuffed, (max(left, 0), max(right, 0)))
    if left < 0 or right < 0:
        stuffed = stuffed[..., max(-left, 0) : stuffed.shape[-1] - max(-right, 0)]
    flipped = w.reshape(groups, cin // groups, cout_group, kernel).transpose(1, 2).flip(-1)
    flipped = flipped.reshape(groups * cout_group, cin // groups, kernel)
    return _conv1d_by_matmul(stuffed, flipped, 1, 0, dilation, groups, matmul)


class _WeightCache:
    """Quantized weights by identity: a module's weights do not change between calls.

    An entry is (q, inverse scale) laid out for its use: `transposed` keeps q.t() contiguous
    (linear), scales are shaped to broadcast against the product."""

    def __init__(self, gemm: IntegerProducts) -> None:
        self._gemm = gemm
        self._entries: dict[tuple[Any, ...], tuple[Any, int, Tensor, Tensor]] = {}

    def get(
        self, weight: Tensor, dims: tuple[int, ...], bits: int, layout: str = ""
    ) -> tuple[Tensor, Tensor]:
        key = (id(weight), dims, bits, layout)
        cached = self._entries.get(key)
        # the weak reference guards against a new tensor at a dead one's id, the version
        # against an in-place update
        if cached is not None and cached[0]() is weight and cached[1] == weight._version:
            return cached[2], cached[3]
        q, inverse = em.quantize_scaled(weight, dims, bits)
        if layout == "linear":  # (N, K) -> q.t() (K, N), inverse (1, N)
            q, inverse = q.t().contiguous(), inverse.reshape(1, -1)
        elif layout == "conv":  # per output channel, broadcast as (1, Cout, 1)
            inverse = inverse.reshape(1, -1, 1)
        q = self._gemm.prepare(q)
        if len(self._entries) > 4096:
            self._entries.clear()
        self._entries[key] = (weakref.ref(weight), weight._version, q, inverse)
        return q, inverse


_DEFAULT_GEMM: IntegerProducts | None = None


def _default_gemm() -> IntegerProducts:
    global _DEFAULT_GEMM
    if _DEFAULT_GEMM is None:
        _DEFAULT_GEMM = IntegerProducts()
    return _DEFAULT_GEMM


def matmul_exact(a: Tensor, b: Tensor, gemm: IntegerProducts | None = None) -> Tensor:
    """a @ b for a (..., M, K), b (..., K, N) with every partial sum exact, rounded once."""
    products = gemm or _default_gemm()
    out_dtype = torch.promote_types(a.dtype, b.dtype)
    if a.dim() == 1 or b.dim() == 1:
        left = a if a.dim() > 1 else a[None]
        right = b if b.dim() > 1 else b[:, None]
        result = matmul_exact(left, right, products)
        return result.squeeze(-1) if b.dim() == 1 else result.squeeze(-2)
    bits = em.operand_bits(a.shape[-1])
    qa, inverse_a = em.quantize_scaled(a, (-1,), bits)
    qb, inverse_b = em.quantize_scaled(b, (-2,), bits)
    return (products.matmul(qa, qb) * inverse_a * inverse_b).to(out_dtype)


class _Products:
    def __init__(self, gemm: IntegerProducts | None = None) -> None:
        self.gemm = gemm or _default_gemm()
        self.weights = _WeightCache(self.gemm)

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        bits = em.operand_bits(x.shape[-1])
        qx, inverse_x = em.quantize_scaled(x, (-1,), bits)
        qw_t, inverse_w = self.weights.get(weight, (1,), bits, "linear")  # per output row
        out = (self.gemm.matmul(qx, qw_t) * inverse_x * inverse_w).to(x.dtype)
        return out + bias if bias is not None else out

    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        return matmul_exact(a, b)

    def addmm(
        self, bias: Tensor, a: Tensor, b: Tensor, beta: float = 1, alpha: float = 1
    ) -> Tensor:
        product = matmul_exact(a, b, self.gemm)
        if alpha != 1:
            product = product * alpha
        return product + (bias * beta if beta != 1 else bias)

    def conv1d(
        self,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
    ) -> Tensor:
        terms = weight.shape[1] * weight.shape[2]

        def weights(bits: int) -> tuple[Tensor, Tensor]:
            return self.weights.get(weight, (1, 2), bits, "conv")  # per output channel

        def product(qx: Tensor, qw: Tensor) -> Tensor:
            return self.gemm.conv1d(qx, qw, stride, padding, dilation, groups)

        return self._conv(x, bias, terms, weights, product)

    def convolution(
        self,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        stride: Any,
        padding: Any,
        dilation: Any,
        transposed: bool,
        output_padding: Any,
        groups: int,
    ) -> Tensor:
        """aten.convolution (what conv1d becomes outside inference mode), 1-D only."""
        if weight.dim() != 3:
            raise PortableKernelError("convolution: only 1-D convolutions have a portable kernel")
        if transposed:
            return self.conv_transpose1d(
                x, weight, bias, stride, padding, output_padding, groups, dilation
            )
        return self.conv1d(x, weight, bias, stride, padding, dilation, groups)

    def conv_transpose1d(
        self,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: int = 1,
        dilation: Any = 1,
    ) -> Tensor:
        terms = (weight.shape[0] // groups) * weight.shape[2]

        def weights(bits: int) -> tuple[Tensor, Tensor]:
            qw, inverse = self.weights.get(weight, (0, 2), bits)  # (1, Cout/groups, 1)
            return qw, inverse.repeat(1, groups, 1)

        def product(qx: Tensor, qw: Tensor) -> Tensor:
            return self.gemm.conv_transpose1d(
                qx, qw, stride, padding, output_padding, groups, dilation
            )

        return self._conv(x, bias, terms, weights, product)

    @staticmethod
    def _conv(
        x: Tensor,
        bias: Tensor | None,
        terms: int,
        weights: Callable[[int], tuple[Tensor, Tensor]],
        product: Callable[[Tensor, Tensor], Tensor],
    ) -> Tensor:
        """What conv1d and conv_transpose1d share: an unbatched input as a batch of one,
        operands quantized for sums of `terms` products, the exact product rescaled and
        rounded once, then the bias."""
        batched = x.dim() == 3
        bits = em.operand_bits(terms)
        qx, inverse_x = em.quantize_scaled(x if batched else x[None], (1, 2), bits)
        qw, inverse_w = weights(bits)
        out = (product(qx, qw) * inverse_x * inverse_w).to(x.dtype)
        if bias is not None:
            out = out + bias.reshape(1, -1, 1)
        return out if batched else out[0]


def handlers(gemm: IntegerProducts | None = None) -> dict[Any, Callable[..., Any]]:
    """The product ops' kernels, computing with `gemm` (None: the process-wide choice)."""
    products = _Products(gemm)
    return {
        aten.linear.default: products.linear,
        aten.matmul.default: products.matmul,
        aten.mm.default: products.matmul,
        aten.bmm.default: products.matmul,
        aten.addmm.default: products.addmm,
        aten.mv.default: products.matmul,
        aten.dot.default: products.matmul,
        aten.addmv.default: products.addmm,
        aten.convolution.default: products.convolution,
        aten.conv1d.default: products.conv1d,
        aten.conv_transpose1d.default: products.conv_transpose1d,
    }
