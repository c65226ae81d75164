"""Helpers shared by the HiFT tests (imported after pytest.importorskip("torch"))."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

from codeclog.vocoder.hift.layers import Snake


def randomise_gains(model: nn.Module, seed: int) -> None:
    """After the fixture init, for parity: random weight-norm gains (x U(0.8, 1.25), so the
    norm's gain and direction both matter) and Snake alphas U(0.5, 2), seeded by `seed`."""
    generator = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, Snake):
                module.alpha.uniform_(0.5, 2.0, generator=generator)
            elif parametrize.is_parametrized(module, "weight"):
                gain = module.parametrizations["weight"].original0
                gain.mul_(torch.empty_like(gain).uniform_(0.8, 1.25, generator=generator))
