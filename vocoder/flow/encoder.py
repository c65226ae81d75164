"""UpsampleConformerEncoderV2, streaming only (upstream `forward_chunk`), with explicit caches
(docs/vocoder.md, "The flow")."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from codeclog.vocoder.flow.config import FlowConfig
from codeclog.vocoder.flow.rows import EncoderRows, cut_context
from codeclog.vocoder.flow.stable import (
    StableConv1d,
    StableLinear,
    layer_norm,
    parameter,
    softmax_keys,
    stable_matmul,
)

CONV2_CONTEXT = 2  # the pre-lookahead conv2 has kernel 3: two frames of left context


def relpos_table(d_model: int, max_len: int) -> Tensor:
    """EspnetRelPositionalEncoding.pe, computed exactly as upstream (float32, on CPU)."""
    pe_positive = torch.zeros(max_len, d_model)
    pe_negative = torch.zeros(max_len, d_model)
    position = torch.arange(0, max_len, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model)
    )
    pe_positive[:, 0::2] = torch.sin(position * div_term)
    pe_positive[:, 1::2] = torch.cos(position * div_term)
    pe_negative[:, 0::2] = torch.sin(-1 * position * div_term)
    pe_negative[:, 1::2] = torch.cos(-1 * position * div_term)
    pe_positive = torch.flip(pe_positive, [0]).unsqueeze(0)
    return torch.cat([pe_positive, pe_negative[1:].unsqueeze(0)], dim=1)


class LinearEmbed(nn.Module):
    """LinearNoSubsampling + its positional scaling (the positions are taken separately)."""

    def __init__(self, idim: int, odim: int) -> None:
        super().__init__()
        self.out = nn.Sequential(StableLinear(idim, odim), layer_norm(odim, eps=1e-5))
        self.xscale = math.sqrt(odim)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(x) * self.xscale


class RelPositionAttention(nn.Module):
    """RelPositionMultiHeadedAttention with an explicit key/value cache."""

    def __init__(self, n_head: int, n_feat: int, key_bias: bool) -> None:
        super().__init__()
        self.d_k = n_feat // n_head
        self.h = n_head
        self.linear_q = StableLinear(n_feat, n_feat)
        self.linear_k = StableLinear(n_feat, n_feat, bias=key_bias)
        self.linear_v = StableLinear(n_feat, n_feat)
        self.linear_out = StableLinear(n_feat, n_feat)
        self.linear_pos = StableLinear(n_feat, n_feat, bias=False)
        self.pos_bias_u = parameter(self.h, self.d_k)
        self.pos_bias_v = parameter(self.h, self.d_k)

    def _heads(self, x: Tensor) -> Tensor:
        return x.view(x.shape[0], -1, self.h, self.d_k)  # (B, T, H, d_k)

    def forward(
        self, x: Tensor, pos_emb: Tensor, cache: Tensor | None, keys: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """x (B, T, C), pos_emb (1, 2 * (Tc + T) - 1, C), cache (B, H, Tc, 2 d_k) or None;
        keys (B, Tc + T): the real keys of a ragged batch (None: all)."""
        q = self._heads(self.linear_q(x))
        k = self._heads(self.linear_k(x)).transpose(1, 2)
        v = self._heads(self.linear_v(x)).transpose(1, 2)
        if cache is not None and cache.shape[0] > 0:
            key_cache, value_cache = torch.split(cache, cache.shape[-1] // 2, dim=-1)
            k = torch.cat([key_cache, k], dim=2)
            v = torch.cat([value_cache, v], dim=2)
        new_cache = torch.cat((k, v), dim=-1)
        p = self._heads(self.linear_pos(pos_emb)).transpose(1, 2)  # (1, H, 2L - 1, d_k)
        q_u = (q + self.pos_bias_u).transpose(1, 2).contiguous()
        q_v = (q + self.pos_bias_v).transpose(1, 2).contiguous()
        matrix_ac = stable_matmul(q_u, k.transpose(-2, -1))
        matrix_bd = stable_matmul(q_v, p.transpose(-2, -1).expand(q_v.shape[0], -1, -1, -1))
        if matrix_ac.shape != matrix_bd.shape:
            matrix_bd = rel_shift(matrix_bd)
        attn = softmax_keys((matrix_ac + matrix_bd) / math.sqrt(self.d_k), keys)
        out = stable_matmul(attn, v)  # (B, H, T, d_k)
        out = out.transpose(1, 2).contiguous().view(x.shape[0], -1, self.h * self.d_k)
        return self.linear_out(out), new_cache


def rel_shift(x: Tensor) -> Tensor:
    """Upstream's rel_shift: (B, H, T1, 2 T2 - 1) -> (B, H, T1, T2) (also for T1 < T2)."""
    zero_pad = torch.zeros((x.shape[0], x.shape[1], x.shape[2], 1), device=x.device, dtype=x.dtype)
    x_padded = torch.cat([zero_pad, x], dim=-1)
    x_padded = x_padded.view(x.shape[0], x.shape[1], x.shape[3] + 1, x.shape[2])
    return x_padded[:, :, 1:].view_as(x)[:, :, :, : x.shape[-1] // 2 + 1]


class FeedForward(nn.Module):
    """PositionwiseFeedForward with the swish (SiLU) activation."""

    def __init__(self, idim: int, hidden_units: int) -> None:
        super().__init__()
        self.w_1 = StableLinear(idim, hidden_units)
        self.w_2 = StableLinear(hidden_units, idim)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(F.silu(self.w_1(x)))


class ConformerLayer(nn.Module):
    """ConformerEncoderLayer as configured upstream: pre-norm, no macaron, no conv module."""

    def __init__(self, size: int, heads: int, linear_units: int, key_bias: bool) -> None:
        super().__init__()
        self.self_attn = RelPositionAttention(heads, size, key_bias)
        self.feed_forward = FeedForward(size, linear_units)
        self.norm_ff = layer_norm(size, eps=1e-12)
        self.norm_mha = layer_norm(size, eps=1e-12)

    def forward(
        self, x: Tensor, pos_emb: Tensor, cache: Tensor | None, keys: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        x_att, new_cache = self.self_attn(self.norm_mha(x), pos_emb, cache, keys)
        x = x + x_att
        x = x + self.feed_forward(self.norm_ff(x))
        return x, new_cache


class PreLookaheadLayer(nn.Module):
    """Right-context conv over the lookahead tokens, then a causal conv, plus a residual."""

    def __init__(self, channels: int, pre_lookahead_len: int) -> None:
        super().__init__()
        self.pre_lookahead_len = pre_lookahead_len
        self.conv1 = StableConv1d(channels, channels, pre_lookahead_len + 1)
        self.conv2 = StableConv1d(channels, channels, CONV2_CONTEXT + 1)

    def forward_chunk(
        self, inputs: Tensor, cache: Tensor | None, ends: list[int] | None = None
    ) -> tuple[Tensor, Tensor]:
        """inputs (B, T, C) with the lookahead at the end -> (B, T - lookahead, C); `ends`:
        each row's new frames in a ragged batch (None: all rows end together)."""
        outputs = F.leaky_relu(self.conv1(inputs.transpose(1, 2).contiguous()))
        if cache is None:
            cache = outputs.new_zeros(outputs.shape[0], outputs.shape[1], CONV2_CONTEXT)
        outputs = torch.cat([cache, outputs], dim=2)
        # Upstream keeps `conv1_out[..., -2:]`; taking the tail after the concat is the same
        # whenever the chunk has >= 2 fresh frames and stays correct for a 1-frame chunk, which
        # upstream cannot continue from (its next call fails the cache-shape assertion).
        new_cache = cut_context(outputs, CONV2_CONTEXT, ends)
        outputs = self.conv2(outputs).transpose(1, 2).contiguous()
        return outputs + inputs[:, : -self.pre_lookahead_len], new_cache


class Upsample1D(nn.Module):
    """Nearest-neighbour x stride, then a causal conv of kernel 2 * stride + 1."""

    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = StableConv1d(channels, channels, stride * 2 + 1)

    def forward_chunk(
        self, inputs: Tensor, cache: Tensor | None, ends: list[int] | None = None
    ) -> tuple[Tensor, Tensor]:
        """inputs (B, C, T) -> (B, C, stride * T); `ends` as PreLookaheadLayer's, in outputs."""
        outputs = F.interpolate(inputs, scale_factor=float(self.stride), mode="nearest")
        if cache is None:
            cache = inputs.new_zeros(inputs.shape[0], inputs.shape[1], self.stride * 2)
        outputs = torch.cat([cache, outputs], dim=2)
        return self.conv(outputs), cut_context(outputs, self.stride * 2, ends)


class UpsampleConformerEncoderV2(nn.Module):
    """Token-rate conformer, x ratio upsample, mel-rate conformer; streaming forward only."""

    def __init__(self, config: FlowConfig) -> None:
        super().__init__()
        size = config.input_size
        self.config = config
        self.embed = LinearEmbed(size, size)
        self.after_norm = layer_norm(size, eps=1e-5)
        self.pre_lookahead_layer = PreLookaheadLayer(size, config.pre_lookahead_len)
        self.encoders = nn.ModuleList(
            ConformerLayer(
                size, config.encoder_heads, config.encoder_linear_units, config.encoder_key_bias
            )
            for _ in range(config.encoder_blocks)
        )
        self.up_layer = Upsample1D(size, config.token_mel_ratio)
        self.up_embed = LinearEmbed(size, size)
        self.up_encoders = nn.ModuleList(
            ConformerLayer(
                size, config.encoder_heads, config.encoder_linear_units, config.encoder_key_bias
            )
            for _ in range(config.encoder_up_blocks)
        )
        self.register_buffer("pe", torch.empty(0), persistent=False)

    def fill_buffers(self) -> None:
        """Compute the rel-pos table (not a parameter; not in flow.pt)."""
        table = relpos_table(self.config.input_size, self.config.max_relpos_frames)
        self.pe = table.to(device=self.after_norm.weight.device, dtype=self.after_norm.weight.dtype)

    def position_encoding(self, size: int) -> Tensor:
        """Relative positions size-1 .. -(size-1), as upstream's `position_encoding`."""
        center = self.pe.shape[1] // 2
        return self.pe[:, center - size + 1 : center + size]

    def forward_chunk(
        self, xs: Tensor, last_chunk: bool, cnn_cache: Tensor | None, att_cache: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """xs (B, T, C) embedded tokens -> (B, ratio * T', C), new cnn cache, new att cache.

        T' = T - lookahead (the lookahead is right context only), or T on the last chunk, whose
        lookahead is zero-padded.
        """
        out = self.encode(xs, last_chunk, cnn_cache, att_cache)
        return out.h, out.cnn, pack_att_caches(out.token_att, out.mel_att, self.config)

    def encode(
        self,
        xs: Tensor,
        last_chunk: bool,
        cnn_cache: Tensor | None,
        att_cache: Tensor | None,
        rows: EncoderRows | None = None,
    ) -> Encoded:
        """forward_chunk's computation, the new attention caches still per layer. With `rows`
        a ragged batch: xs right-padded; att_cache (L, B, H, ratio * top, 2 d_k) left-padded
        per row, the token-rate layers' token caches in their first `top` frames; pad keys
        masked; the cnn caches cut at each row's end (the attention caches are the caller's)."""
        n_token_layers = len(self.encoders)
        ratio = self.config.token_mel_ratio
        offset = att_cache.shape[3] // ratio if att_cache is not None else 0  # in tokens
        xs = self.embed(xs)
        if rows is not None:
            xs = xs * rows.id_mask(xs.shape[1], last_chunk, self.config.pre_lookahead_len, xs)
        if last_chunk:
            xs = F.pad(xs, (0, 0, 0, self.config.pre_lookahead_len))
        cache1 = cnn_cache[:, :, :CONV2_CONTEXT] if cnn_cache is not None else None
        ends = rows.ends(1) if rows is not None else None
        xs, new_cnn1 = self.pre_lookahead_layer.forward_chunk(xs, cache1, ends)
        pos_emb = self.position_encoding(offset + xs.shape[1])
        keys = rows.keys(1, xs.shape[1], xs.device) if rows is not None else None
        token_caches = []
        for idx, layer in enumerate(self.encoders):
            cache = att_cache[idx, :, :, :offset] if att_cache is not None else None
            xs, new_cache = layer(xs, pos_emb, cache, keys)
            token_caches.append(new_cache)
        cache2 = cnn_cache[:, :, CONV2_CONTEXT:] if cnn_cache is not None else None
        ends = rows.ends(ratio) if rows is not None else None
        up, new_cnn2 = self.up_layer.forward_chunk(xs.transpose(1, 2).contiguous(), cache2, ends)
        xs = self.up_embed(up.transpose(1, 2).contiguous())
        pos_emb = self.position_encoding(offset * ratio + xs.shape[1])
        keys = rows.keys(ratio, xs.shape[1], xs.device) if rows is not None else None
        mel_caches = []
        for idx, layer in enumerate(self.up_encoders):
            cache = att_cache[n_token_layers + idx] if att_cache is not None else None
            xs, new_cache = layer(xs, pos_emb, cache, keys)
            mel_caches.append(new_cache)
        cnn = torch.cat([new_cnn1, new_cnn2], dim=2)
        return Encoded(self.after_norm(xs), cnn, token_caches, mel_caches)


@dataclasses.dataclass(frozen=True, eq=False)
class Encoded:
    """The encoder's output h (B, ratio * T', C), its new cnn cache (B, C, 2 + 2 ratio) and the
    new attention cache of every token-rate and of every mel-rate layer, (B, H, T, 2 d_k)."""

    h: Tensor
    cnn: Tensor
    token_att: list[Tensor]
    mel_att: list[Tensor]


def pack_att_caches(token: list[Tensor], mel: list[Tensor], config: FlowConfig) -> Tensor:
    """Layer caches (..., T, 2 d_k) stacked into the state's layout (L, ..., T, 2 d_k): the
    token-rate layers first, each repeated x ratio along T ([cache, cache]) to the mel length."""
    tokens = torch.stack(token, dim=0)
    tiling = [1] * (tokens.dim() - 2) + [config.token_mel_ratio, 1]
    return torch.cat([tokens.repeat(*tiling), torch.stack(mel, dim=0)], dim=0)
