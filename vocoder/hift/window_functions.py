"""The HiFT's constant windows, the iSTFT's periodic Hann and scheme A's Hamming cross-fade: the
same bytes on every CPU under portable kernels (docs/vocoder.md, "HiFT, scheme A")."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from codeclog.vocoder.kernels import exactmath, portable_active


def hann_periodic(n_fft: int) -> Tensor:
    """scipy.signal.get_window("hann", n, fftbins=True) with scipy's own arithmetic, in float32
    (upstream builds its iSTFT window that way; scipy is not a dependency here). Under portable
    kernels numpy's cos (vectorised differently by CPU) is replaced by the portable one."""
    fac = np.linspace(-np.pi, np.pi, n_fft + 1)
    window = np.zeros(n_fft + 1)
    for k, coefficient in enumerate((0.5, 0.5)):
        window += coefficient * _cos(k * fac)
    return torch.from_numpy(window[:-1].astype(np.float32))


def _cos(values: np.ndarray) -> np.ndarray:
    if not portable_active():
        return np.cos(values)
    return exactmath.cos(torch.from_numpy(np.asarray(values, dtype=np.float64))).numpy()


def fade_window(overlap: int, device: torch.device | str = "cpu") -> Tensor:
    """np.hamming(2 * overlap) in float64, as upstream builds `speech_window` (7680 samples),
    with the portable cos under portable kernels (numpy: 0.54 + 0.46 cos(pi n / (M - 1)))."""
    size = 2 * overlap
    if size < 2 or not portable_active():
        return torch.from_numpy(np.hamming(size)).to(device)
    n = np.arange(1 - size, size, 2)
    return torch.from_numpy(0.54 + 0.46 * _cos(np.pi * n / (size - 1))).to(device)
