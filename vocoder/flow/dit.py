"""The DiT estimator (decoder_dit.DiT, "DiT-v5"), streaming only, with explicit caches
(docs/vocoder.md, "The flow")."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from codeclog.vocoder.flow.config import FlowConfig
from codeclog.vocoder.flow.rows import ChunkRows, cut_context
from codeclog.vocoder.flow.stable import StableConv1d, StableLinear, attend, layer_norm

CONV_KERNEL = 3
CONV_CONTEXT = CONV_KERNEL - 1
FREQUENCY_EMBEDDING_SIZE = 256
TIMESTEP_SCALE = 1000


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale) + shift


class DiTAttention(nn.Module):
    """Multi-head attention with LayerNorm on q and k, over [chunk, cache]."""

    def __init__(self, dim: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        inner = num_heads * head_dim
        self.to_q = StableLinear(dim, inner)
        self.to_k = StableLinear(dim, inner)
        self.to_v = StableLinear(dim, inner)
        self.q_norm = layer_norm(head_dim)
        self.k_norm = layer_norm(head_dim)
        self.proj = StableLinear(inner, dim)

    def _heads(self, x: Tensor) -> Tensor:
        rows, frames, width = x.shape
        return x.reshape(rows, frames, self.num_heads, width // self.num_heads).transpose(1, 2)

    def forward_chunk(
        self, x: Tensor, cache: Tensor | None, out_cache: Tensor, keys: Tensor | None = None
    ) -> Tensor:
        """x (N, F, dim); cache (N, H, T, 2 hd) or None; out_cache (N, H, F + T, 2 hd) is
        filled with the new cache [this chunk, cache]; keys (N, F + T): the real keys of a
        ragged batch (None: all)."""
        frames = x.shape[1]
        q = self.q_norm(self._heads(self.to_q(x)))
        out_cache[:, :, :frames, : self.head_dim] = self.k_norm(self._heads(self.to_k(x)))
        out_cache[:, :, :frames, self.head_dim :] = self._heads(self.to_v(x))
        if cache is not None:
            out_cache[:, :, frames:] = cache
        y = attend(q, out_cache[..., : self.head_dim], out_cache[..., self.head_dim :], keys)
        return self.proj(y.transpose(1, 2).reshape(x.shape[0], frames, -1))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = StableLinear(dim, hidden)
        self.fc2 = StableLinear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CausalConvBlock(nn.Module):
    """conv(k=3, causal) -> LayerNorm -> Mish -> conv(k=3, causal), on (N, F, C).

    `block` keeps upstream's Sequential indices (1: conv, 3: norm, 6: conv) for the weights;
    the parameter-free transposes and the activation are identities here and done inline.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = channels
        conv1 = StableConv1d(channels, channels, CONV_KERNEL)
        conv2 = StableConv1d(channels, channels, CONV_KERNEL)
        norm = layer_norm(channels)
        self.block = nn.ModuleList(
            [nn.Identity(), conv1, nn.Identity(), norm, nn.Identity(), nn.Identity(), conv2]
        )

    def forward_chunk(
        self, x: Tensor, cache: Tensor | None, ends: tuple[int, ...] | None = None
    ) -> tuple[Tensor, Tensor]:
        """x (N, F, C); cache (N, 2C, 2) or None -> (N, F, C), new cache (N, 2C, 2), cut at
        each row's `ends` in a ragged batch (None: at F)."""
        if cache is None:
            cache = x.new_zeros((x.shape[0], 2 * self.channels, CONV_CONTEXT))
        cache1, cache2 = cache.split((self.channels, self.channels), dim=1)
        h = torch.cat([cache1, x.transpose(1, 2)], dim=2)
        new1 = cut_context(h, CONV_CONTEXT, ends)
        h = self.block[1](h).transpose(1, 2)
        h = F.mish(self.block[3](h)).transpose(1, 2)
        h = torch.cat([cache2, h], dim=2)
        new2 = cut_context(h, CONV_CONTEXT, ends)
        return self.block[6](h).transpose(1, 2), torch.cat((new1, new2), dim=1)


class DiTBlock(nn.Module):
    """adaLN-Zero block: attention, causal conv, MLP, each gated by the timestep embedding."""

    def __init__(self, config: FlowConfig) -> None:
        super().__init__()
        hidden = config.dit_hidden_size
        self.norm1 = layer_norm(hidden, affine=False, eps=1e-6)
        self.attn = DiTAttention(hidden, config.dit_heads, config.dit_head_dim)
        self.norm2 = layer_norm(hidden, affine=False, eps=1e-6)
        self.mlp = Mlp(hidden, int(hidden * config.dit_mlp_ratio))
        self.norm3 = layer_norm(hidden, affine=False, eps=1e-6)
        self.conv = CausalConvBlock(hidden)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), StableLinear(hidden, 9 * hidden))

    def forward_chunk(
        self,
        x: Tensor,
        modulation: Sequence[Tensor],
        cnn_cache: Tensor | None,
        att_cache: Tensor | None,
        att_out: Tensor,
        rows: ChunkRows | None = None,
    ) -> tuple[Tensor, Tensor]:
        """x (N, F, hidden); modulation: this block's nine (its part of `TimeConditioning`)."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = modulation[:6]
        shift_conv, scale_conv, gate_conv = modulation[6:]
        x_att = self.attn.forward_chunk(
            modulate(self.norm1(x), shift_msa, scale_msa),
            att_cache,
            att_out,
            rows.keys if rows is not None else None,
        )
        x = x + gate_msa * x_att
        x_conv, new_cnn = self.conv.forward_chunk(
            modulate(self.norm3(x), shift_conv, scale_conv),
            cnn_cache,
            rows.ends if rows is not None else None,
        )
        x = x + gate_conv * x_conv
        x = x + gate_mlp * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x, new_cnn


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            StableLinear(FREQUENCY_EMBEDDING_SIZE, hidden), nn.SiLU(), StableLinear(hidden, hidden)
        )

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(timestep_embedding(t * TIMESTEP_SCALE, FREQUENCY_EMBEDDING_SIZE))


def timestep_embedding(t: Tensor, dim: int, max_period: int = 10000) -> Tensor:
    """Sinusoidal embedding of (N,) timesteps, as upstream (glide-text2im)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(start=0, end=half) / half).to(t)
    args = t[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class FinalLayer(nn.Module):
    def __init__(self, hidden: int, out_channels: int) -> None:
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), StableLinear(hidden, 2 * hidden))
        self.norm_final = layer_norm(hidden, affine=False, eps=1e-6)
        self.linear = StableLinear(hidden, out_channels)

    def forward(self, x: Tensor, modulation: Sequence[Tensor]) -> Tensor:
        shift, scale = modulation
        return self.linear(modulate(self.norm_final(x), shift, scale))


@dataclasses.dataclass(frozen=True)
class TimeConditioning:
    """What the timestep alone decides: every block's nine modulations and the final layer's
    two, (1, 1, hidden) each, broadcast over the rows (all rows share the time)."""

    blocks: tuple[tuple[Tensor, ...], ...]
    final: tuple[Tensor, ...]


class DiT(nn.Module):
    """The velocity estimator: (x, mu, spk, cond) at mel rate -> d x / d t."""

    def __init__(self, config: FlowConfig) -> None:
        super().__init__()
        hidden = config.dit_hidden_size
        self.config = config
        self.t_embedder = TimestepEmbedder(hidden)
        self.in_proj = StableLinear(config.estimator_in_channels, hidden)
        self.blocks = nn.ModuleList(DiTBlock(config) for _ in range(config.dit_depth))
        self.final_layer = FinalLayer(hidden, config.mel_dim)

    def row_macs(self, frames: int) -> int:
        """The multiply-adds of one row's projections over `frames` frames in one call (q, k,
        v, out, the two k=3 convs and the MLP of every block): the size of a row's work."""
        c = self.config
        hidden, inner = c.dit_hidden_size, c.dit_heads * c.dit_head_dim
        block = (
            4 * hidden * inner
            + 2 * 3 * hidden * hidden
            + 2 * int(hidden * c.dit_mlp_ratio) * hidden
        )
        return frames * len(self.blocks) * block

    def att_cache_shape(self, rows: int, frames: int) -> tuple[int, ...]:
        """(depth, rows, heads, frames, 2 * head_dim): one step's attention caches."""
        c = self.config
        return (len(self.blocks), rows, c.dit_heads, frames, 2 * c.dit_head_dim)

    def condition(self, t: Tensor) -> TimeConditioning:
        """The modulations at time t (1,), computed for one row: the bytes every row of a solo
        or batched decode gets, paid for once (the solver keeps them across windows)."""
        c = self.t_embedder(t).unsqueeze(1)
        blocks = tuple(
            tuple(block.adaLN_modulation(c).chunk(9, dim=-1))
            for block in self.blocks
            if isinstance(block, DiTBlock)
        )
        final = tuple(self.final_layer.adaLN_modulation(c).chunk(2, dim=-1))
        return TimeConditioning(blocks, final)

    def condition_parameters(self) -> list[Tensor]:
        """The weights `condition` reads (the solver's memo is valid while they are)."""
        modules: list[nn.Module] = [self.t_embedder, self.final_layer.adaLN_modulation]
        modules += [block.adaLN_modulation for block in self.blocks if isinstance(block, DiTBlock)]
        return [p for module in modules for p in module.parameters()]

    def forward_chunk(
        self,
        x: Tensor,
        mu: Tensor,
        conditioning: TimeConditioning,
        spks: Tensor,
        cond: Tensor,
        cnn_cache: Tensor | None,
        att_cache: Tensor | None,
        att_out: Tensor,
        rows: ChunkRows | None = None,
    ) -> tuple[Tensor, Tensor]:
        """x, mu, cond (N, mel, F); conditioning: `condition(t)` at the time of every row (the
        solver steps all rows together); spks (N, mel) -> (N, mel, F), new cnn cache.

        att_out (depth, N, H, F + T, 2 hd) receives the new attention caches; `rows`: a ragged
        batch's key mask and row ends (None: equal rows).
        """
        frames = x.shape[2]
        h = torch.cat([x, mu, spks.unsqueeze(2).expand(-1, -1, frames), cond], dim=1)
        h = self.in_proj(h.transpose(1, 2))
        new_cnn = []
        for index, block in enumerate(self.blocks):
            assert isinstance(block, DiTBlock)
            h, block_cnn = block.forward_chunk(
                h,
                conditioning.blocks[index],
                cnn_cache[index] if cnn_cache is not None else None,
                att_cache[index] if att_cache is not None else None,
                att_out[index],
                rows,
            )
            new_cnn.append(block_cnn)
        return self.final_layer(h, conditioning.final).transpose(1, 2), torch.stack(new_cnn, dim=0)
