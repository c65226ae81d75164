"""Portable spectra: stft and istft as exact products with float64 DFT tables and a fixed-order
overlap-add (docs/determinism.md, "Portable kernels")."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from codeclog.vocoder.errors import PortableKernelError
from codeclog.vocoder.kernels import exactmath as em
from codeclog.vocoder.kernels.products import matmul_exact

aten = torch.ops.aten
F64 = torch.float64


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
    real = matmul_exact(frames, cos_table)
    imag = -matmul_exact(frames, sin_table)
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
    return matmul_exact(stacked, torch.cat([basis_real, basis_imag], dim=0))


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
    real = (matmul_exact(moved, cos_table) * scale).movedim(-1, axis)
    imag = (-matmul_exact(moved, sin_table) * scale).movedim(-1, axis)
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


HANDLERS: dict[Any, Callable[..., Any]] = {
    aten.stft.default: _stft,
    aten.istft.default: _istft,
    aten._fft_r2c.default: _fft_r2c,
    aten._fft_c2r.default: _fft_c2r,
}
