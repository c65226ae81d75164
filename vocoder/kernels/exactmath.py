"""Deterministic float64 math from IEEE basic operations only, and sums whose order cannot
matter (docs/determinism.md, "Portable kernels")."""

from __future__ import annotations

import math

import torch
from torch import Tensor

F64 = torch.float64
_MANTISSA_BITS = 53
_EXPONENT_BIAS = 1023

# Cody-Waite splits: the *_HI parts have trailing zero bits, so n * HI is exact for |n| < 2**20.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LOG2E = 1.4426950408889634
_PIO2_1 = 1.57079632673412561417e00
_PIO2_2 = 6.07710050630396597660e-11
_PIO2_3 = 2.02226624871116645580e-21
_TWO_OVER_PI = 6.36619772367581382433e-01
_SQRT_HALF = 0.7071067811865476

# Taylor terms to about 1e-13 relative: 2**16 times finer than the float32 results rounded from
# them (accuracy only keeps portable close to native; determinism comes from the fixed op order).
_EXP_TERMS = tuple(1 / math.factorial(k) for k in range(12))  # |r| <= ln2 / 2
_EXPM1_SMALL = 0.25
_SIN_TERMS = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(7))  # |r| <= pi / 4
_COS_TERMS = tuple((-1) ** k / math.factorial(2 * k) for k in range(8))
_ATANH_TERMS = tuple(1 / (2 * k + 1) for k in range(10))  # s**2 <= 0.0295


def _horner(x: Tensor, coefficients: tuple[float, ...]) -> Tensor:
    """c0 + c1 x + c2 x^2 + ... evaluated from the highest term, one rounded op at a time."""
    result = torch.full_like(x, coefficients[-1])
    for coefficient in reversed(coefficients[:-1]):
        result = result * x
        result = result + coefficient
    return result


def pow2(exponent: Tensor) -> Tensor:
    """2**n exactly, for integer-valued n in [-1022, 1023], built from the float64 bit layout."""
    biased = exponent.to(torch.int64).clamp(-1022, 1023) + _EXPONENT_BIAS
    return torch.bitwise_left_shift(biased, 52).view(F64)


def exp(x: Tensor) -> Tensor:
    x = x.to(F64).clamp(-708.0, 709.0)
    n = torch.round(x * _LOG2E)
    r = x - n * _LN2_HI
    r = r - n * _LN2_LO
    return _horner(r, _EXP_TERMS) * pow2(n)


def expm1(x: Tensor) -> Tensor:
    """exp(x) - 1 without cancellation near 0 (Taylor there, exp elsewhere)."""
    x = x.to(F64)
    small = x.abs() < _EXPM1_SMALL
    near = _horner(torch.where(small, x, torch.zeros_like(x)), _EXP_TERMS[1:]) * x
    far = exp(x) - 1.0
    return torch.where(small, near, far)


def log(x: Tensor) -> Tensor:
    """Natural log for x > 0: x = m * 2**e with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s)."""
    x = x.to(F64)
    mantissa, exponent = torch.frexp(x)
    low = mantissa < _SQRT_HALF
    mantissa = torch.where(low, mantissa * 2.0, mantissa)
    e = (exponent - low.to(exponent.dtype)).to(F64)
    f = mantissa - 1.0
    s = f / (f + 2.0)
    log_m = _horner(s * s, _ATANH_TERMS) * s * 2.0
    result = e * _LN2_HI + (e * _LN2_LO + log_m)
    result = torch.where(x == 0, torch.full_like(x, -math.inf), result)
    return torch.where(x < 0, torch.full_like(x, math.nan), result)


def _quadrant(x: Tensor) -> tuple[Tensor, Tensor]:
    """x = n * pi/2 + r with |r| <= pi/4 (about), and n mod 4."""
    n = torch.round(x * _TWO_OVER_PI)
    r = x - n * _PIO2_1
    r = r - n * _PIO2_2
    r = r - n * _PIO2_3
    quadrant = n - torch.floor(n * 0.25) * 4.0
    return r, quadrant


def sin(x: Tensor) -> Tensor:
    r, quadrant = _quadrant(x.to(F64))
    r2 = r * r
    s, c = _horner(r2, _SIN_TERMS) * r, _horner(r2, _COS_TERMS)
    return _by_quadrant(quadrant, (s, c, -s, -c))


def cos(x: Tensor) -> Tensor:
    return sincos(x)[1]


def sincos(x: Tensor) -> tuple[Tensor, Tensor]:
    """(sin x, cos x) from one range reduction."""
    r, quadrant = _quadrant(x.to(F64))
    r2 = r * r
    s, c = _horner(r2, _SIN_TERMS) * r, _horner(r2, _COS_TERMS)
    return _by_quadrant(quadrant, (s, c, -s, -c)), _by_quadrant(quadrant, (c, -s, -c, s))


def _by_quadrant(quadrant: Tensor, values: tuple[Tensor, Tensor, Tensor, Tensor]) -> Tensor:
    result = values[3]
    for index in (2, 1, 0):
        result = torch.where(quadrant == float(index), values[index], result)
    return result


_TANH_SMALL = 2.0**-6
_TANH_TERMS = (1.0, -1 / 3, 2 / 15, -17 / 315)  # odd series in x**2, |x| < 2**-6: ~1e-14


def tanh(x: Tensor) -> Tensor:
    """(1 - t) / (1 + t) with t = e^(-2|x|); its series where that cancels (|x| < 2**-6)."""
    x = x.to(F64)
    t = exp(x.abs() * -2.0)
    magnitude = (1.0 - t) / (t + 1.0)
    magnitude = torch.where(x < 0, -magnitude, magnitude)
    small = x.abs() < _TANH_SMALL
    return torch.where(small, _horner(x * x, _TANH_TERMS) * x, magnitude)


def sigmoid(x: Tensor) -> Tensor:
    x = x.to(F64)
    return 1.0 / (exp(-x) + 1.0)


def tree_sum(x: Tensor, dim: int, keepdim: bool = False) -> Tensor:
    """Sum over `dim` by pairwise halving in a fixed order (elementwise adds only)."""
    moved = x.movedim(dim, -1)
    size = moved.shape[-1]
    width = 1 << max(0, (size - 1).bit_length())
    if width != size:
        moved = torch.nn.functional.pad(moved, (0, width - size))
    while width > 1:
        width //= 2
        moved = moved[..., :width] + moved[..., width:]
    total = moved[..., 0]
    return total.unsqueeze(dim) if keepdim else total


_BIAS_PLUS_BITS = {bits: _EXPONENT_BIAS + bits for bits in range(64)}


def operand_bits(terms: int) -> int:
    """Bits per operand such that a sum of `terms` products of two of them stays below 2**53."""
    headroom = max(0, (max(terms, 1) - 1).bit_length())
    return min(26, (_MANTISSA_BITS - headroom) // 2)


def quantize(x: Tensor, dims: tuple[int, ...], bits: int) -> tuple[Tensor, Tensor]:
    """x (float64) as (q, shift): q integer-valued with |q| <= 2**bits, x ~= q * 2**-shift, one
    shift per slice over `dims` (the slice's largest magnitude sets it)."""
    peak = x.abs().amax(dim=dims, keepdim=True)
    _, exponent = torch.frexp(peak)  # |x| < 2**exponent
    shift = (bits - exponent).to(F64).clamp(-1000.0, 1000.0)
    return torch.round(x * pow2(shift)), shift


def quantize_scaled(x: Tensor, dims: tuple[int, ...], bits: int) -> tuple[Tensor, Tensor]:
    """As quantize, but returns (q, 2**-shift): the factor that undoes the scaling."""
    x = x.to(F64)
    peak = x.abs().amax(dim=dims, keepdim=True)
    exponent = torch.frexp(peak)[1].to(torch.int64).clamp(bits - 1000, bits + 1000)
    scale = torch.bitwise_left_shift(_BIAS_PLUS_BITS[bits] - exponent, 52).view(F64)
    inverse = torch.bitwise_left_shift(exponent + (_EXPONENT_BIAS - bits), 52).view(F64)
    return torch.round(x * scale), inverse


def unscale(product: Tensor, *shifts: Tensor) -> Tensor:
    """product * 2**-(sum of shifts), one exact power-of-two step per shift."""
    for shift in shifts:
        product = product * pow2(-shift)
    return product


def exact_cumsum(x: Tensor, dim: int) -> Tensor:
    """Cumulative sum with every partial sum exact (float64 integers below 2**53)."""
    x = x.to(F64)
    terms = x.shape[dim]
    bits = _MANTISSA_BITS - max(1, terms.bit_length()) - 1
    q, shift = quantize(x, (dim,), bits)
    return unscale(torch.cumsum(q, dim=dim), shift)
