"""Portable tensor factories: randn, arange and linspace by torch's own formulas in float64,
rounded once (docs/determinism.md, "Portable kernels")."""

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


HANDLERS: dict[Any, Callable[..., Any]] = {
    aten.randn.generator: _randn,
    aten.linspace.default: _linspace,
    aten.arange.default: _arange,
    aten.arange.start: _arange,
    aten.arange.start_step: _arange,
}
