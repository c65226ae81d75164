"""What both HiFT variants build their generators from: Snake, the resblock and source-down
stacks, the filter stages, the weight-norm fusion (docs/vocoder.md, "HiFT, scheme A")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from codeclog.vocoder.hift.config import HiftConfig


class Snake(nn.Module):
    """x + sin²(αx)/α with a learned per-channel α (BigVGAN), as upstream computes it:
    `x + (1 / (α + 1e-9)) * sin(x α)²`, with the per-channel factors computed once per value of
    α and the products and the sum done in place (the same IEEE operations on the same
    operands, so the same bytes: a square is a product, both are commutative)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))
        self._factors: tuple[tuple[int, int, torch.dtype], Tensor, Tensor] | None = None

    def forward(self, x: Tensor) -> Tensor:
        alpha, inverse = self._per_channel()
        waves = torch.sin(x * alpha)
        return waves.mul_(waves).mul_(inverse).add_(x)

    def _per_channel(self) -> tuple[Tensor, Tensor]:
        """α and 1 / (α + 1e-9) as (1, C, 1); kept while α is unchanged (no autograd)."""
        key = (self.alpha._version, self.alpha.data_ptr(), self.alpha.dtype)
        if torch.is_grad_enabled() or self._factors is None or self._factors[0] != key:
            alpha = self.alpha.unsqueeze(0).unsqueeze(-1)
            factors = (key, alpha, 1.0 / (alpha + 1e-9))
            if torch.is_grad_enabled():  # kept tensors would be inference tensors or a graph's
                return factors[1], factors[2]
            self._factors = factors
        return self._factors[1], self._factors[2]


class FilterStages(Protocol):
    """The modules of the filter network both HiFT variants share (same names, same calls)."""

    ups: nn.ModuleList
    reflection_pad: nn.ReflectionPad1d
    source_downs: nn.ModuleList
    source_resblocks: nn.ModuleList
    resblocks: nn.ModuleList
    conv_post: nn.Module


def filter_stages(hift: FilterStages, x: Tensor, s_stft: Tensor, config: StageSizes) -> Tensor:
    """From conv_pre's output through conv_post: each upsampling stage adds the excitation's
    STFT brought to its rate and averages its resblocks. One body for the noncausal, ragged
    and causal decodes: their bytes depend on this exact order of operations."""
    stages = len(hift.ups)
    kernels = len(config.resblock_kernel_sizes)
    for i in range(stages):
        x = hift.ups[i](F.leaky_relu(x, config.lrelu_slope))
        if i == stages - 1:
            x = hift.reflection_pad(x)
        x = x + hift.source_resblocks[i](hift.source_downs[i](s_stft))
        xs = hift.resblocks[i * kernels](x)
        for j in range(1, kernels):
            xs += hift.resblocks[i * kernels + j](x)
        x = xs / kernels
    return hift.conv_post(F.leaky_relu(x))


class StageSizes(Protocol):
    """The settings both HiFT variants' filter networks are built and run with."""

    @property
    def base_channels(self) -> int: ...
    @property
    def upsample_rates(self) -> tuple[int, ...]: ...
    @property
    def resblock_kernel_sizes(self) -> tuple[int, ...]: ...
    @property
    def resblock_dilations(self) -> tuple[tuple[int, ...], ...]: ...
    @property
    def source_resblock_kernel_sizes(self) -> tuple[int, ...]: ...
    @property
    def source_resblock_dilations(self) -> tuple[tuple[int, ...], ...]: ...
    @property
    def lrelu_slope(self) -> float: ...


def resblock_stacks(
    config: StageSizes, block: Callable[[int, int, tuple[int, ...]], nn.Module]
) -> tuple[nn.ModuleList, nn.ModuleList]:
    """The source resblocks (one per upsampling stage) and the resblocks (one per kernel size
    per stage), in the order and with the channels the checkpoints' parameter names expect;
    `block` is the variant's ResBlock class."""
    stages = range(len(config.upsample_rates))
    source = zip(config.source_resblock_kernel_sizes, config.source_resblock_dilations, strict=True)
    kernels = list(zip(config.resblock_kernel_sizes, config.resblock_dilations, strict=True))
    channels = [config.base_channels // 2 ** (i + 1) for i in stages]
    return (
        nn.ModuleList(block(channels[i], k, d) for i, (k, d) in enumerate(source)),
        nn.ModuleList(block(channels[i], k, d) for i in stages for k, d in kernels),
    )


def source_downs(
    config: HiftConfig,
    pointwise: Callable[[int, int], nn.Module],
    strided: Callable[[int, int, int], nn.Module],
) -> nn.ModuleList:
    """The convs bringing the excitation STFT to each upsampling stage's rate: `pointwise`
    (in, out) where the rate is 1 (the last stage), `strided` (in, out, rate) elsewhere; the
    variant's layer classes (scheme A: plain convs, no weight norm upstream)."""
    downsample_rates = [1, *config.upsample_rates[::-1][:-1]]
    cumulative = [int(u) for u in np.cumprod(downsample_rates)[::-1]]
    cin = config.istft_n_fft + 2
    layers = []
    for i, rate in enumerate(cumulative):
        cout = config.base_channels // 2 ** (i + 1)
        layers.append(pointwise(cin, cout) if rate == 1 else strided(cin, cout, rate))
    return nn.ModuleList(layers)


def fuse_weight_norm(module: nn.Module) -> None:
    """Bake weight-norm parametrizations into plain weights for inference. The fused weight is
    the very tensor the parametrization computes on every call, so outputs are unchanged; state
    dict keys change, so load weights before fusing."""
    for submodule in module.modules():
        if parametrize.is_parametrized(submodule, "weight"):
            parametrize.remove_parametrizations(submodule, "weight", leave_parametrized=True)
