"""Portable kernels: the vocoder's numerically sensitive torch ops, owned so that the audio bytes
are the same on every x86-64 CPU (determinism.md: the native kernels differ by vendor and ISA).

`PortableKernels` is a TorchDispatchMode. Inside it every aten op the vocoder runs is either
- exact everywhere, and runs natively: views, copies, indexing, comparisons, max/min, clamp,
  float casts, and the IEEE basic operations (add/sub with alpha 1, mul, div, sqrt), which every
  CPU rounds identically, one op at a time;
- replaced: matmul/linear/conv in float64 on operands rounded to integers small enough that every
  partial sum is exact (`exactmath.quantize`), so the BLAS/convolution order cannot matter;
  reductions (layer norm, softmax, norms) as fixed-order pairwise sums; exp/log/sin/cos/tanh and
  the activations as float64 polynomials (`exactmath`); stft/istft as DFT products and a
  fixed-order overlap-add; randn as torch's own Box-Muller over its uniform draws;
- or refused with PortableKernelError: an op not listed here could round differently by CPU, so
  it is a bug to run it in portable mode, never a silent fallback.

Each replaced op computes in float64 and rounds once to the caller's dtype. The results differ
from the native kernels' by float32 rounding noise (see BENCHMARKS.md for the measured bound).
"""

from __future__ import annotations

import functools
import math
import os
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from codeclog.vocoder.errors import VocoderError
from codeclog.vocoder.kernels import exactmath as em

aten = torch.ops.aten
F64 = torch.float64
Handler = Callable[..., Any]


class PortableKernelError(VocoderError):
    """An op without a portable kernel ran in portable mode."""


# Ops whose native results are the same bits on every CPU (exact, or one IEEE operation).
_EXACT = {
    aten.reshape.default, aten.view.default, aten.view.dtype, aten._unsafe_view.default,
    aten.slice.Tensor, aten.select.int, aten.transpose.int, aten.t.default, aten.permute.default,
    aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.squeeze.dims,
    aten.expand.default, aten.expand_as.default, aten.view_as.default, aten.alias.default,
    aten.unfold.default, aten.chunk.default, aten.split.Tensor, aten.split_with_sizes.default,
    aten.unbind.int, aten.movedim.int, aten.as_strided.default, aten.flip.default,
    aten.roll.default, aten.transpose_.default,
    aten.cat.default, aten.stack.default, aten.contiguous.default, aten.clone.default,
    aten.copy_.default, aten.detach.default, aten.detach_.default, aten.lift_fresh.default,
    aten.resolve_conj.default, aten.resolve_neg.default, aten.complex.default,
    aten.view_as_real.default, aten.view_as_complex.default, aten.real.default,
    aten.to.device, aten.to.dtype, aten.to.dtype_layout, aten._to_copy.default,
    aten.zeros.default, aten.zeros_like.default, aten.ones.default, aten.ones_like.default,
    aten.empty.memory_format, aten.empty_like.default, aten.full.default, aten.full_like.default,
    aten.new_zeros.default, aten.new_ones.default, aten.new_empty.default, aten.new_full.default,
    aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default, aten.scalar_tensor.default,
    aten.index.Tensor, aten.index_select.default, aten.gather.default, aten.embedding.default,
    aten.index_put_.default, aten.masked_fill.Scalar, aten.masked_fill_.Scalar, aten.where.self,
    aten.repeat.default, aten.repeat_interleave.self_int, aten.constant_pad_nd.default,
    aten.pad.default, aten.reflection_pad1d.default, aten.replication_pad1d.default,
    aten.item.default, aten._local_scalar_dense.default, aten.sym_size.int,
    aten.mul.Tensor, aten.mul.Scalar, aten.mul_.Tensor, aten.mul_.Scalar, aten.multiply.Tensor,
    aten.div.Tensor, aten.div.Scalar, aten.div_.Tensor, aten.div_.Scalar, aten.neg.default,
    aten.sqrt.default, aten.abs.default, aten.sign.default, aten.reciprocal.default,
    aten.floor.default, aten.ceil.default, aten.round.default, aten.trunc.default,
    aten.frexp.Tensor, aten.bitwise_left_shift.Tensor_Scalar, aten.remainder.Scalar,
    aten.remainder.Tensor, aten.fmod.Scalar,
    aten.clamp.default, aten.clamp.Tensor, aten.clip.default, aten.clamp_min.default,
    aten.clamp_max.default, aten.maximum.default, aten.minimum.default,
    aten.max.default, aten.min.default, aten.amax.default, aten.amin.default,
    aten.max.dim, aten.min.dim, aten.argmax.default,
    aten.gt.Scalar, aten.gt.Tensor, aten.lt.Scalar, aten.lt.Tensor, aten.ge.Scalar,
    aten.ge.Tensor, aten.le.Scalar, aten.le.Tensor, aten.eq.Scalar, aten.eq.Tensor,
    aten.ne.Scalar, aten.ne.Tensor, aten.logical_not.default, aten.logical_and.default,
    aten.bitwise_and.Tensor, aten.any.default, aten.all.default, aten.isnan.default,
    aten.leaky_relu.default, aten.relu.default, aten.upsample_nearest1d.vec,
    aten.rand.generator, aten.uniform_.default, aten.randint.generator, aten.randint.low_generator,
}  # fmt: skip


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


def _round_to(dtype: torch.dtype) -> Callable[[Tensor], Tensor]:
    return lambda value: value.to(dtype)


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


# -- exact products -----------------------------------------------------------------------------


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


def _matmul_exact(a: Tensor, b: Tensor, gemm: IntegerProducts | None = None) -> Tensor:
    """a @ b for a (..., M, K), b (..., K, N) with every partial sum exact, rounded once."""
    products = gemm or _default_gemm()
    out_dtype = torch.promote_types(a.dtype, b.dtype)
    if a.dim() == 1 or b.dim() == 1:
        left = a if a.dim() > 1 else a[None]
        right = b if b.dim() > 1 else b[:, None]
        result = _matmul_exact(left, right, products)
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
        return _matmul_exact(a, b)

    def addmm(
        self, bias: Tensor, a: Tensor, b: Tensor, beta: float = 1, alpha: float = 1
    ) -> Tensor:
        product = _matmul_exact(a, b, self.gemm)
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


# -- spectra ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _dft_tables(n_fft: int) -> tuple[Tensor, Tensor]:
    """cos and sin of 2 pi k n / N for k in 0..N/2, n in 0..N-1: (N, bins) each, float64."""
    k = torch.arange(n_fft // 2 + 1, dtype=torch.int64)
    n = torch.arange(n_fft, dtype=torch.int64)
    phase = (n[:, None] * k[None, :]) % n_fft  # exact integers
    angle = phase.to(F64) * (2.0 * math.pi / n_fft)
    return em.cos(angle), em.sin(angle)


def _stft(
    x: Tensor,
    n_fft: int,
    hop_length: int | None = None,
    win_length: int | None = None,
    window: Tensor | None = None,
    normalized: bool = False,
    onesided: bool | None = None,
    return_complex: bool | None = None,
    *_: Any,
) -> Tensor:
    if normalized or onesided is False or (win_length not in (None, n_fft)):
        raise PortableKernelError("stft: only onesided, unnormalized, win_length == n_fft")
    hop = hop_length if hop_length is not None else n_fft // 4
    frames = x.to(F64).unfold(-1, n_fft, hop)  # (..., frames, n_fft)
    if window is not None:
        frames = frames * window.to(F64)
    cos_table, sin_table = _dft_tables(n_fft)
    real = _matmul_exact(frames, cos_table)
    imag = -_matmul_exact(frames, sin_table)
    real_dtype = x.dtype
    spec = torch.complex(real.to(real_dtype), imag.to(real_dtype))  # (..., frames, bins)
    return spec.transpose(-1, -2)


def _istft(
    spec: Tensor,
    n_fft: int,
    hop_length: int | None = None,
    win_length: int | None = None,
    window: Tensor | None = None,
    center: bool = True,
    normalized: bool = False,
    onesided: bool | None = None,
    length: int | None = None,
    return_complex: bool = False,
) -> Tensor:
    hop = hop_length if hop_length is not None else n_fft // 4
    if normalized or return_complex or onesided is False or win_length not in (None, n_fft):
        raise PortableKernelError("istft: only onesided, unnormalized real output")
    if n_fft % hop:
        raise PortableKernelError("istft: n_fft must be a multiple of hop_length")
    real_dtype = torch.float32 if spec.dtype == torch.complex64 else F64
    parts = torch.view_as_real(spec.transpose(-1, -2)).to(F64)  # (..., frames, bins, 2)
    frames = _irfft_frames(parts[..., 0], parts[..., 1], n_fft)
    win = window.to(F64) if window is not None else torch.ones(n_fft, dtype=F64)
    signal = _overlap_add(frames * win, hop)
    envelope = _overlap_add((win * win).expand(frames.shape[-2], n_fft)[None], hop)[0]
    start = n_fft // 2 if center else 0
    end = start + length if length is not None else envelope.shape[-1] - start
    signal, envelope = signal[..., start:end], envelope[start:end]
    if bool((envelope.abs() < 1e-11).any()):
        raise PortableKernelError("istft: window overlap-add has zeros (NOLA)")
    return (signal / envelope).to(real_dtype)


def _irfft_frames(real: Tensor, imag: Tensor, n_fft: int) -> Tensor:
    """Inverse real DFT of (..., frames, bins) as one exact product: (..., frames, n_fft)."""
    bins = n_fft // 2 + 1
    cos_table, sin_table = _dft_tables(n_fft)  # (n_fft, bins)
    weight = torch.full((bins,), 2.0, dtype=F64)
    weight[0] = 1.0
    if n_fft % 2 == 0:
        weight[-1] = 1.0
    basis_real = (cos_table * weight).t() / n_fft  # (bins, n_fft)
    basis_imag = -(sin_table * weight).t() / n_fft
    basis_imag[0] = 0.0
    if n_fft % 2 == 0:
        basis_imag[-1] = 0.0
    stacked = torch.cat([real, imag], dim=-1)
    return _matmul_exact(stacked, torch.cat([basis_real, basis_imag], dim=0))


_FFT_SCALE = {0: lambda n: 1.0, 1: lambda n: 1.0 / math.sqrt(n), 2: lambda n: 1.0 / n}


def _fft_r2c(x: Tensor, dim: Sequence[int], normalization: int, onesided: bool) -> Tensor:
    """aten._fft_r2c over one dim (what stft becomes outside inference mode)."""
    if len(dim) != 1 or not onesided:
        raise PortableKernelError("_fft_r2c: one dim, onesided only")
    axis = dim[0] % x.dim()
    n_fft = x.shape[axis]
    cos_table, sin_table = _dft_tables(n_fft)
    moved = x.to(F64).movedim(axis, -1)
    scale = _FFT_SCALE[normalization](n_fft)
    real = (_matmul_exact(moved, cos_table) * scale).movedim(-1, axis)
    imag = (-_matmul_exact(moved, sin_table) * scale).movedim(-1, axis)
    return torch.complex(real.to(x.dtype), imag.to(x.dtype))


def _fft_c2r(spec: Tensor, dim: Sequence[int], normalization: int, last_dim_size: int) -> Tensor:
    """aten._fft_c2r over one dim (istft's inverse DFT outside inference mode)."""
    if len(dim) != 1:
        raise PortableKernelError("_fft_c2r: one dim only")
    axis = dim[0] % spec.dim()
    parts = torch.view_as_real(spec.movedim(axis, -1)).to(F64)
    frames = _irfft_frames(parts[..., 0], parts[..., 1], last_dim_size) * last_dim_size
    scale = _FFT_SCALE[normalization](last_dim_size)
    real_dtype = torch.float32 if spec.dtype == torch.complex64 else F64
    return (frames * scale).movedim(-1, axis).to(real_dtype)


def _overlap_add(frames: Tensor, hop: int) -> Tensor:
    """frames (..., T, N) placed at t * hop and summed, in the fixed order r = 0..N/hop-1."""
    count, n_fft = frames.shape[-2], frames.shape[-1]
    length = n_fft + hop * (count - 1)
    out = torch.zeros((*frames.shape[:-2], length), dtype=frames.dtype)
    for r in range(n_fft // hop):
        block = frames[..., r * hop : (r + 1) * hop].reshape(*frames.shape[:-2], count * hop)
        out[..., r * hop : r * hop + count * hop] = (
            out[..., r * hop : r * hop + count * hop] + block
        )
    return out


# -- random -------------------------------------------------------------------------------------


def _randn(
    size: Sequence[int],
    *,
    generator: torch.Generator | None = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> Tensor:
    """torch's CPU normal_ (Box-Muller in blocks of 16 over its uniform draws, the last 16
    redrawn when the size is not a multiple of 16), with the transcendentals in float64."""
    count = math.prod(size)
    target = dtype if isinstance(dtype, torch.dtype) else torch.float32
    if generator is None:
        raise PortableKernelError("randn without an explicit generator")
    if count < 16:
        raise PortableKernelError("randn of fewer than 16 values (torch's serial path)")
    uniform = torch.rand(count, generator=generator, dtype=torch.float32).to(F64)
    whole = count - count % 16
    values = box_muller(uniform[:whole])
    if count % 16:
        tail = torch.rand(16, generator=generator, dtype=torch.float32).to(F64)
        values = torch.cat([values[: count - 16], box_muller(tail)])
    return values.to(target).reshape(tuple(size)).to(device if device is not None else "cpu")


def box_muller(uniform: Tensor) -> Tensor:
    """torch's normal_fill_16 over blocks of 16 uniforms (float64): value j of a block from
    u1 = 1 - u[j], u2 = u[j + 8]; value j + 8 from the same pair's sine."""
    blocks = uniform.reshape(-1, 2, 8)
    u1 = 1.0 - blocks[:, 0]
    u2 = blocks[:, 1]
    radius = torch.sqrt(em.log(u1) * -2.0)
    sine, cosine = em.sincos(u2 * (2.0 * math.pi))
    return torch.stack([radius * cosine, radius * sine], dim=1).reshape(-1)


def _arange(*args: Any, dtype: Any = None, **kwargs: Any) -> Tensor:
    """Integer-valued aranges are exact anyway; others as start + i * step in float64."""
    bounds = [float(a) for a in args]
    start, end, step = (0.0, bounds[0], 1.0) if len(bounds) == 1 else (*bounds[:2], 1.0)
    if len(bounds) == 3:
        step = bounds[2]
    count = max(0, math.ceil((end - start) / step))
    index = torch.arange(count, dtype=F64)
    target = dtype if isinstance(dtype, torch.dtype) else None
    if target is None:
        integral = all(isinstance(a, int) for a in args)
        target = torch.int64 if integral else torch.get_default_dtype()
    return (index * step + start).to(target)


def _linspace(start: float, end: float, steps: int, *, dtype: Any = None, **_: Any) -> Tensor:
    """torch's two-sided formula (from the start below the middle, from the end above it)."""
    target = dtype if isinstance(dtype, torch.dtype) else torch.float32
    if steps == 1:
        return torch.full((1,), float(start), dtype=target)
    step = (float(end) - float(start)) / (steps - 1)
    index = torch.arange(steps, dtype=F64)
    half = steps // 2
    low = index * step + float(start)
    high = float(end) - (steps - 1 - index) * step
    return torch.where(index < half, low, high).to(target)


# -- the mode -----------------------------------------------------------------------------------


def _handlers(products: _Products) -> dict[Any, Handler]:
    return {
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
        aten.upsample_linear1d.vec: _upsample_linear1d,
        aten.upsample_linear1d.default: _upsample_linear1d_sizes,
        aten.stft.default: _stft,
        aten.istft.default: _istft,
        aten._fft_r2c.default: _fft_r2c,
        aten._fft_c2r.default: _fft_c2r,
        aten.randn.generator: _randn,
        aten.linspace.default: _linspace,
        aten.arange.default: _arange,
        aten.arange.start: _arange,
        aten.arange.start_step: _arange,
    }


class PortableKernels(TorchDispatchMode):
    """Run the enclosed torch code with the portable kernels (module doc). Thread-local: enter
    it in every thread that computes."""

    def __init__(self, gemm: IntegerProducts | None = None) -> None:
        super().__init__()
        self._handlers = _handlers(_Products(gemm))

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No torch.compile runs under these kernels, so `__torch_dispatch__` is left unwrapped:
        torch's dynamo-disabling wrapper would import torch._dynamo on the first op (about 3 s
        of start-up, a minute under qemu) and add a call to every op."""
        return False

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        handler = self._handlers.get(func)
        if handler is not None:
            return handler(*args, **kwargs)
        if func in _EXACT:
            return func(*args, **kwargs)
        raise PortableKernelError(
            f"{func} has no portable kernel: its result could differ by CPU "
            "(add it to vocoder/kernels/portable.py, or use --kernels native)"
        )
