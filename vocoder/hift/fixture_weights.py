"""Seeded random weights for the HiFT fixtures of both variants, drawn from one generator so that
the tiny fixture's audio exercises every stage (docs/vocoder.md, "Weights")."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from codeclog.vocoder.hift.layers import Snake

FIXTURE_GAIN = 1.5  # U(+-gain/sqrt(fan_in)): keeps the mel path alive through three stages
FIXTURE_POST_GAIN = 0.7  # conv_post: log-magnitudes of order 1, so exp() neither vanishes nor clips
FIXTURE_F0_HZ = 150.0  # F0 head bias: most frames voiced (> 10 Hz), the harmonic source runs
FIXTURE_F0_GAIN = 60.0  # F0 head weights: F0 moves with the mel (about 120-170 Hz)


def initialise_hift(model: nn.Module, seed: int) -> None:
    """Random weights from one seeded generator, for fixtures (real weights come from hift.pt).

    Not upstream's training init (N(0, 0.01) for the upsampling, resblock and output convs):
    with it the mel's contribution shrinks ~100x per stage and the audio of an untrained model
    is the source noise alone, so a golden hash would not notice a broken flow. Instead every
    layer draws U(+-FIXTURE_GAIN/sqrt(fan_in)) (conv_post FIXTURE_POST_GAIN), the F0 head is set
    so that most frames are voiced, weight-norm gains equal the norm of their direction (the
    effective weight is the drawn one) and Snake alphas are 1. `model`: a HiFTGenerator or a
    CausalHiFTGenerator (the same parameter names).
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, module in model.named_modules():
            _initialise_module(name, module, generator)
        head = model.get_submodule("f0_predictor.classifier")
        assert isinstance(head, nn.Linear)
        bound = FIXTURE_F0_GAIN / math.sqrt(head.weight.shape[1])
        head.weight.uniform_(-bound, bound, generator=generator)
        head.bias.fill_(FIXTURE_F0_HZ)


def _weight_parts(module: nn.Module) -> tuple[Tensor | None, Tensor]:
    """(weight-norm gain or None, the drawn weight tensor) of a layer."""
    if parametrize.is_parametrized(module, "weight"):
        parametrizations = module.parametrizations
        assert isinstance(parametrizations, nn.ModuleDict)
        weight = parametrizations["weight"]
        gain, direction = weight.original0, weight.original1
        assert isinstance(gain, Tensor) and isinstance(direction, Tensor)
        return gain, direction
    assert isinstance(module.weight, Tensor)
    return None, module.weight


def _initialise_module(name: str, module: nn.Module, generator: torch.Generator) -> None:
    if isinstance(module, Snake):
        module.alpha.fill_(1.0)
        return
    if not isinstance(module, nn.Conv1d | nn.ConvTranspose1d | nn.Linear):
        return
    gain, direction = _weight_parts(module)
    scale = FIXTURE_POST_GAIN if name == "conv_post" else FIXTURE_GAIN
    bound = scale / math.sqrt(direction[0].numel())
    direction.uniform_(-bound, bound, generator=generator)
    if gain is not None:
        dims = tuple(range(1, direction.dim()))
        gain.copy_(torch.linalg.vector_norm(direction, dim=dims, keepdim=True))
    if module.bias is not None:
        module.bias.uniform_(-bound, bound, generator=generator)
