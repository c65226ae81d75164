"""Ragged batching of the flow: windows of different lengths and cache lengths in ONE call.

The exact path (`Token2WavFlow.decode_chunk_batch`) batches only states of equal shape. This
module decodes B windows whose lengths, conformer and DiT cache lengths differ, with padding and
attention masks, so a step of N streams at mixed positions makes one flow call per `last_chunk`
value. Rows are padded as follows, so that every valid position sees exactly the values its solo
decode sees (only the reduction widths differ, hence a bound, not bytes; docs/vocoder.md):

- new frames (ids, mel frames) are right-padded; the convolutions are causal (or look right
  only into the row's own lookahead), so padding never reaches a valid position;
- conformer caches are LEFT-padded: the query of the relative-position attention then keeps its
  distance to every real key, and pad keys are masked;
- DiT caches are right-padded and masked (its attention has no positions);
- every new cache is cut out per row (the row's real frames only), then trimmed as upstream.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from codeclog.vocoder.flow.cfm import ConditionalFlowMatching, cosine_t_span
from codeclog.vocoder.flow.dit import CONV_CONTEXT, DiT, DiTBlock, modulate
from codeclog.vocoder.flow.encoder import (
    CONV2_CONTEXT,
    ConformerLayer,
    RelPositionAttention,
    UpsampleConformerEncoderV2,
    rel_shift,
)
from codeclog.vocoder.flow.stable import stable_matmul
from codeclog.vocoder.flow.state import FlowState, trim_state

NEG_INF = float("-inf")


def key_mask(
    pad_before: Sequence[int], valid: Sequence[int], total: int, device: torch.device
) -> Tensor:
    """(B, total) bool: row b's keys pad_before[b] .. pad_before[b] + valid[b] - 1 are real."""
    index = torch.arange(total, device=device)[None]
    start = torch.tensor(pad_before, device=device)[:, None]
    stop = start + torch.tensor(valid, device=device)[:, None]
    return (index >= start) & (index < stop)


def _masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """softmax over the last axis of (B', H, Tq, Tk) scores with a (B', Tk) key mask."""
    return torch.softmax(scores.masked_fill(~mask[:, None, None, :], NEG_INF), dim=-1)


# -- the conformer encoder -------------------------------------------------------------------


def _rel_attention(
    attn: RelPositionAttention, x: Tensor, pos_emb: Tensor, cache: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """RelPositionAttention.forward with a key mask; cache (B, H, Tc, 2 d_k), left-padded."""
    q = attn._heads(attn.linear_q(x))
    k = attn._heads(attn.linear_k(x)).transpose(1, 2)
    v = attn._heads(attn.linear_v(x)).transpose(1, 2)
    key_cache, value_cache = torch.split(cache, cache.shape[-1] // 2, dim=-1)
    k = torch.cat([key_cache, k], dim=2)
    v = torch.cat([value_cache, v], dim=2)
    new_cache = torch.cat((k, v), dim=-1)
    p = attn._heads(attn.linear_pos(pos_emb)).transpose(1, 2)
    q_u = (q + attn.pos_bias_u).transpose(1, 2).contiguous()
    q_v = (q + attn.pos_bias_v).transpose(1, 2).contiguous()
    matrix_ac = stable_matmul(q_u, k.transpose(-2, -1))
    matrix_bd = stable_matmul(q_v, p.transpose(-2, -1).expand(q_v.shape[0], -1, -1, -1))
    if matrix_ac.shape != matrix_bd.shape:
        matrix_bd = rel_shift(matrix_bd)
    weights = _masked_softmax((matrix_ac + matrix_bd) / math.sqrt(attn.d_k), mask)
    out = stable_matmul(weights, v)
    out = out.transpose(1, 2).contiguous().view(x.shape[0], -1, attn.h * attn.d_k)
    return attn.linear_out(out), new_cache


def _conformer_layer(
    layer: ConformerLayer, x: Tensor, pos_emb: Tensor, cache: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    x_att, new_cache = _rel_attention(layer.self_attn, layer.norm_mha(x), pos_emb, cache, mask)
    x = x + x_att
    return x + layer.feed_forward(layer.norm_ff(x)), new_cache


def _left_pad(tensors: Sequence[Tensor], axis: int, length: int) -> Tensor:
    """Stack along a new axis 0 after left-padding `axis` with zeros to `length`."""
    rows = []
    for tensor in tensors:
        shape = list(tensor.shape)
        shape[axis] = length - tensor.shape[axis]
        rows.append(torch.cat([tensor.new_zeros(shape), tensor], dim=axis))
    return torch.stack(rows)


def _right_pad(tensor: Tensor, axis: int, length: int) -> Tensor:
    shape = list(tensor.shape)
    shape[axis] = length - tensor.shape[axis]
    return torch.cat([tensor, tensor.new_zeros(shape)], dim=axis)


def encode_ragged(
    encoder: UpsampleConformerEncoderV2,
    xs: Tensor,
    fresh: Sequence[int],
    last_chunk: bool,
    states: Sequence[FlowState],
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """xs (B, T, C) embedded, right-padded (zeros past each row's ids); fresh[b] new tokens.
    Returns h (B, ratio * max fresh, C), and per row its new cnn and att caches."""
    config = encoder.config
    ratio = config.token_mel_ratio
    layers = len(encoder.encoders)
    device = xs.device
    count = len(states)
    cached = [int(s.conformer_att_cache.shape[2]) for s in states]  # mel-rate frames
    tokens_cached = [c // ratio for c in cached]
    top = max(tokens_cached)
    xs = encoder.embed(xs) * _row_mask(fresh, xs.shape[1], last_chunk, config.pre_lookahead_len, xs)
    if last_chunk:
        xs = F.pad(xs, (0, 0, 0, config.pre_lookahead_len))
    cnn = torch.stack([s.conformer_cnn_cache for s in states])
    pre = encoder.pre_lookahead_layer
    outputs = F.leaky_relu(pre.conv1(xs.transpose(1, 2).contiguous()))
    outputs = torch.cat([cnn[:, :, :CONV2_CONTEXT], outputs], dim=2)
    new_cnn1 = [outputs[b, :, fresh[b] : fresh[b] + CONV2_CONTEXT] for b in range(count)]
    outputs = pre.conv2(outputs).transpose(1, 2).contiguous()
    xs = outputs + xs[:, : -pre.pre_lookahead_len]
    width = xs.shape[1]
    pos_emb = encoder.position_encoding(top + width)
    mask = key_mask(
        [top - t for t in tokens_cached],
        [t + n for t, n in zip(tokens_cached, fresh, strict=True)],
        top + width,
        device,
    )
    token_rows: list[list[Tensor]] = [[] for _ in range(count)]
    for idx, layer in enumerate(encoder.encoders):
        rows = [
            s.conformer_att_cache[idx, :, :t] for s, t in zip(states, tokens_cached, strict=True)
        ]
        cache = _left_pad(rows, 1, top)
        assert isinstance(layer, ConformerLayer)
        xs, new_cache = _conformer_layer(layer, xs, pos_emb, cache, mask)
        for b in range(count):
            start = top - tokens_cached[b]
            token_rows[b].append(new_cache[b, :, start : top + fresh[b]])
    up_cache = cnn[:, :, CONV2_CONTEXT:]
    up_layer = encoder.up_layer
    up = F.interpolate(
        xs.transpose(1, 2).contiguous(), scale_factor=float(up_layer.stride), mode="nearest"
    )
    up = torch.cat([up_cache, up], dim=2)
    context = up_layer.stride * 2
    new_cnn2 = [up[b, :, ratio * fresh[b] : ratio * fresh[b] + context] for b in range(count)]
    xs = encoder.up_embed(up_layer.conv(up).transpose(1, 2).contiguous())
    mel_top = top * ratio
    mel_width = xs.shape[1]
    pos_emb = encoder.position_encoding(mel_top + mel_width)
    mask = key_mask(
        [mel_top - c for c in cached],
        [c + ratio * n for c, n in zip(cached, fresh, strict=True)],
        mel_top + mel_width,
        device,
    )
    mel_rows: list[list[Tensor]] = [[] for _ in range(count)]
    for idx, layer in enumerate(encoder.up_encoders):
        cache = _left_pad([s.conformer_att_cache[layers + idx] for s in states], 1, mel_top)
        assert isinstance(layer, ConformerLayer)
        xs, new_cache = _conformer_layer(layer, xs, pos_emb, cache, mask)
        for b in range(count):
            start = mel_top - cached[b]
            mel_rows[b].append(new_cache[b, :, start : mel_top + ratio * fresh[b]])
    h = encoder.after_norm(xs)
    new_att = [
        torch.cat(
            [torch.stack(token_rows[b]).repeat(1, 1, ratio, 1), torch.stack(mel_rows[b])], dim=0
        )
        for b in range(count)
    ]
    new_cnn = [torch.cat([new_cnn1[b], new_cnn2[b]], dim=1) for b in range(count)]
    return h, new_cnn, new_att


def _row_mask(
    fresh: Sequence[int], width: int, last_chunk: bool, lookahead: int, like: Tensor
) -> Tensor:
    """(B, width, 1): 1 over each row's ids (fresh + lookahead, or fresh on the last chunk)."""
    ids = [n if last_chunk else n + lookahead for n in fresh]
    index = torch.arange(width, device=like.device)[None]
    return (index < torch.tensor(ids, device=like.device)[:, None]).to(like.dtype)[:, :, None]


# -- the DiT estimator and the Euler solver --------------------------------------------------


def _dit_attention(
    block: DiTBlock, x: Tensor, cache: Tensor, mask: Tensor, fresh: int
) -> tuple[Tensor, Tensor]:
    """DiTAttention over [chunk (right-padded to `fresh`), cache (right-padded)], masked.
    Returns the output and the padded new cache (N, H, fresh + T, 2 hd)."""
    attn = block.attn
    hd = attn.head_dim
    q = attn.q_norm(attn._heads(attn.to_q(x)))
    k = attn.k_norm(attn._heads(attn.to_k(x)))
    v = attn._heads(attn.to_v(x))
    new_cache = torch.cat([torch.cat([k, v], dim=-1), cache], dim=2)
    scores = stable_matmul(q, new_cache[..., :hd].transpose(-2, -1))
    weights = _masked_softmax(scores * (1.0 / math.sqrt(hd)), mask)
    y = stable_matmul(weights, new_cache[..., hd:])
    return attn.proj(y.transpose(1, 2).reshape(x.shape[0], fresh, -1)), new_cache


def _conv_block(
    block: DiTBlock, x: Tensor, cache: Tensor, frames: Sequence[int]
) -> tuple[Tensor, Tensor]:
    """CausalConvBlock.forward_chunk with each row's new cache cut at its own last frame."""
    conv = block.conv
    cache1, cache2 = cache.split((conv.channels, conv.channels), dim=1)
    h = torch.cat([cache1, x.transpose(1, 2)], dim=2)
    new1 = torch.stack([h[b, :, f : f + CONV_CONTEXT] for b, f in enumerate(frames)])
    h = conv.block[1](h).transpose(1, 2)
    h = F.mish(conv.block[3](h)).transpose(1, 2)
    h = torch.cat([cache2, h], dim=2)
    new2 = torch.stack([h[b, :, f : f + CONV_CONTEXT] for b, f in enumerate(frames)])
    return conv.block[6](h).transpose(1, 2), torch.cat((new1, new2), dim=1)


def _dit_block(
    block: DiTBlock,
    x: Tensor,
    c: Tensor,
    cnn: Tensor,
    att: Tensor,
    mask: Tensor,
    frames: Sequence[int],
) -> tuple[Tensor, Tensor, Tensor]:
    modulation = block.adaLN_modulation(c).chunk(9, dim=-1)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = modulation[:6]
    shift_conv, scale_conv, gate_conv = modulation[6:]
    x_att, new_att = _dit_attention(
        block, modulate(block.norm1(x), shift_msa, scale_msa), att, mask, x.shape[1]
    )
    x = x + gate_msa * x_att
    x_conv, new_cnn = _conv_block(
        block, modulate(block.norm3(x), shift_conv, scale_conv), cnn, frames
    )
    x = x + gate_conv * x_conv
    x = x + gate_mlp * block.mlp(modulate(block.norm2(x), shift_mlp, scale_mlp))
    return x, new_cnn, new_att


def _estimate(
    dit: DiT,
    x: Tensor,
    mu: Tensor,
    t: Tensor,
    spks: Tensor,
    cond: Tensor,
    cnn: Tensor,
    att: Tensor,
    mask: Tensor,
    frames: Sequence[int],
) -> tuple[Tensor, Tensor, Tensor]:
    """DiT.forward_chunk, ragged: cnn (depth, N, 2 hidden, 2), att (depth, N, H, T, 2 hd)."""
    c = dit.t_embedder(t).unsqueeze(1)
    width = x.shape[2]
    h = torch.cat([x, mu, spks.unsqueeze(2).expand(-1, -1, width), cond], dim=1)
    h = dit.in_proj(h.transpose(1, 2))
    new_cnn, new_att = [], []
    for index, block in enumerate(dit.blocks):
        assert isinstance(block, DiTBlock)
        h, block_cnn, block_att = _dit_block(block, h, c, cnn[index], att[index], mask, frames)
        new_cnn.append(block_cnn)
        new_att.append(block_att)
    return dit.final_layer(h, c).transpose(1, 2), torch.stack(new_cnn), torch.stack(new_att)


def solve_ragged(
    cfm: ConditionalFlowMatching,
    mu: Tensor,
    spks: Tensor,
    frames: Sequence[int],
    states: Sequence[FlowState],
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """The CFM solve of B rows with frames[b] mel frames each (mu right-padded to the widest).
    Returns mel (B, mel, F_max) and per row its new estimator cnn and att caches."""
    count, width = mu.shape[0], mu.shape[2]
    cached = [s.noise_offset for s in states]
    top = max(cached)
    z = torch.stack(
        [
            _right_pad(cfm.noise_slice(o, f)[0], 1, width)
            for o, f in zip(cached, frames, strict=True)
        ]
    )
    x = z * 1.0
    t_span = cosine_t_span(cfm.config.n_timesteps, mu)
    rate = cfm.config.inference_cfg_rate
    # (n_t, depth, 2B, ...) in [cond x B | uncond x B] order, the DiT caches right-padded to `top`
    cnn = torch.cat(
        [torch.stack([s.estimator_cnn_cache[:, :, g] for s in states], dim=2) for g in (0, 1)],
        dim=2,
    )
    att = torch.cat(
        [
            torch.stack([_right_pad(s.estimator_att_cache[:, :, g], 3, top) for s in states], dim=2)
            for g in (0, 1)
        ],
        dim=2,
    )
    valid = [(f, c) for f, c in zip(frames, cached, strict=True)] * 2
    index = torch.arange(width + top, device=mu.device)[None]
    fresh_t = torch.tensor([f for f, _ in valid], device=mu.device)[:, None]
    cache_t = torch.tensor([c for _, c in valid], device=mu.device)[:, None]
    mask = (index < fresh_t) | ((index >= width) & (index < width + cache_t))
    rows_frames = [f for f, _ in valid]
    t, dt = t_span[0].unsqueeze(dim=0), t_span[1] - t_span[0]
    mu_in = torch.cat([mu, torch.zeros_like(mu)], dim=0)
    spks_in = torch.cat([spks, torch.zeros_like(spks)], dim=0)
    cond_in = torch.zeros_like(mu_in)
    steps = len(t_span) - 1
    new_cnn, new_att = [], []
    for step in range(1, steps + 1):
        dphi_dt, step_cnn, step_att = _estimate(
            cfm.estimator,
            torch.cat([x, x], dim=0),
            mu_in,
            t.expand(2 * count),
            spks_in,
            cond_in,
            cnn[step - 1],
            att[step - 1],
            mask,
            rows_frames,
        )
        new_cnn.append(step_cnn)
        new_att.append(step_att)
        dphi_dt, cfg_dphi_dt = dphi_dt.chunk(2, dim=0)
        dphi_dt = (1.0 + rate) * dphi_dt - rate * cfg_dphi_dt
        x = x + dt * dphi_dt
        t = t + dt
        if step < steps:
            dt = t_span[step + 1] - t
    cnn_all, att_all = torch.stack(new_cnn), torch.stack(new_att)  # (n_t, depth, 2B, ...)
    cnn_rows, att_rows = [], []
    for b in range(count):
        rows = [b, count + b]
        cnn_rows.append(cnn_all[:, :, rows])
        f, c = frames[b], cached[b]
        chunk = att_all[:, :, rows, :, :f]
        cache = att_all[:, :, rows, :, width : width + c]
        att_rows.append(torch.cat([chunk, cache], dim=4))
    return x, cnn_rows, att_rows


def decode_ragged(
    flow: object, states: Sequence[FlowState], windows: Sequence[Sequence[int]], last_chunk: bool
) -> tuple[list[Tensor], list[FlowState]]:
    """One flow call for B windows of any lengths and states of any cache lengths (all
    `last_chunk` alike). Returns each row's mel (mel_dim, F_b) and its new, trimmed state.
    The caller checks the inputs (`Token2WavFlow.check_ragged`)."""
    from codeclog.vocoder.flow.model import Token2WavFlow

    assert isinstance(flow, Token2WavFlow)
    config = flow.config
    lookahead = config.pre_lookahead_len
    fresh = [len(w) if last_chunk else len(w) - lookahead for w in windows]
    width = max(len(w) for w in windows)
    device = flow.device
    tokens = torch.zeros((len(windows), width), dtype=torch.long, device=device)
    for b, window in enumerate(windows):
        tokens[b, : len(window)] = torch.tensor(list(window), dtype=torch.long, device=device)
    spks = torch.stack([s.spk for s in states])
    h, conf_cnn, conf_att = encode_ragged(
        flow.encoder, flow.input_embedding(tokens), fresh, last_chunk, states
    )
    mu = flow.encoder_proj(h).transpose(1, 2).contiguous()
    frames = [config.token_mel_ratio * n for n in fresh]
    mel_mask = (
        torch.arange(mu.shape[2], device=device)[None]
        < torch.tensor(frames, device=device)[:, None]
    )
    mu = mu * mel_mask[:, None, :].to(mu.dtype)
    mel, est_cnn, est_att = solve_ragged(flow.decoder, mu, spks, frames, states)
    out_states = []
    for b, state in enumerate(states):
        new = FlowState(
            conformer_cnn_cache=conf_cnn[b].clone(),
            conformer_att_cache=conf_att[b].clone(),
            estimator_cnn_cache=est_cnn[b].clone(),
            estimator_att_cache=est_att[b].clone(),
            spk=state.spk,
            prompt_frames=state.prompt_frames,
            chunks_done=state.chunks_done + 1,
            finished=last_chunk,
        )
        out_states.append(trim_state(new, config))
    return [mel[b, :, : frames[b]] for b in range(len(states))], out_states
