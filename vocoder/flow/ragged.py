"""Ragged batching of the flow: windows of different lengths and cache lengths in ONE call
(docs/vocoder.md, "Ragged batching")."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from codeclog.vocoder.flow.cfm import ConditionalFlowMatching
from codeclog.vocoder.flow.encoder import UpsampleConformerEncoderV2, pack_att_caches
from codeclog.vocoder.flow.rows import ChunkRows, EncoderRows
from codeclog.vocoder.flow.state import FlowState, cfg_rows, trim_state


def _right_pad(tensor: Tensor, axis: int, length: int) -> Tensor:
    shape = list(tensor.shape)
    shape[axis] = length - tensor.shape[axis]
    return torch.cat([tensor, tensor.new_zeros(shape)], dim=axis)


# -- the conformer encoder -------------------------------------------------------------------


def _conformer_caches(
    states: Sequence[FlowState], rows: EncoderRows, encoder: UpsampleConformerEncoderV2
) -> Tensor:
    """(L, B, H, ratio * top, 2 d_k): each row's conformer cache left-padded to `top` tokens;
    the token-rate layers hold the token cache (the first half of their packed [cache, cache])
    in their first `top` frames, as `encode` reads them."""
    layers, ratio = len(encoder.encoders), encoder.config.token_mel_ratio
    first = states[0].conformer_att_cache
    shape = (first.shape[0], len(states), first.shape[1], ratio * rows.top, first.shape[3])
    padded = first.new_zeros(shape)
    for b, (state, tokens) in enumerate(zip(states, rows.cached, strict=True)):
        cache = state.conformer_att_cache
        padded[:layers, b, :, rows.top - tokens : rows.top] = cache[:layers, :, :tokens]
        padded[layers:, b, :, ratio * rows.top - cache.shape[2] :] = cache[layers:]
    return padded


def encode_ragged(
    encoder: UpsampleConformerEncoderV2,
    xs: Tensor,
    fresh: Sequence[int],
    last_chunk: bool,
    states: Sequence[FlowState],
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """xs (B, T, C) embedded ids, right-padded; fresh[b] new tokens.
    Returns h (B, ratio * max fresh, C), and per row its new cnn and att caches."""
    ratio = encoder.config.token_mel_ratio
    cached = [int(s.conformer_att_cache.shape[2]) for s in states]  # mel-rate frames
    rows = EncoderRows(fresh=tuple(fresh), cached=tuple(c // ratio for c in cached))
    cnn = torch.stack([s.conformer_cnn_cache for s in states])
    out = encoder.encode(xs, last_chunk, cnn, _conformer_caches(states, rows, encoder), rows)
    new_att = []
    for b, (tokens, mels, n) in enumerate(zip(rows.cached, cached, rows.fresh, strict=True)):
        token = [cache[b, :, rows.top - tokens : rows.top + n] for cache in out.token_att]
        start, stop = ratio * rows.top - mels, ratio * (rows.top + n)
        mel = [cache[b, :, start:stop] for cache in out.mel_att]
        new_att.append(pack_att_caches(token, mel, encoder.config))
    return out.h, list(out.cnn), new_att


# -- the DiT estimator and the Euler solver --------------------------------------------------


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
    cnn = cfg_rows([s.estimator_cnn_cache for s in states])
    att = cfg_rows([_right_pad(s.estimator_att_cache, 4, top) for s in states])  # right-padded
    ends = tuple(frames) * 2
    index = torch.arange(width + top, device=mu.device)[None]
    fresh_t = torch.tensor(ends, device=mu.device)[:, None]
    cache_t = torch.tensor(cached * 2, device=mu.device)[:, None]
    keys = (index < fresh_t) | ((index >= width) & (index < width + cache_t))
    x, cnn_all, att_all = cfm.solve(
        z * 1.0, mu, spks, torch.zeros_like(mu), cnn, att, ChunkRows(keys, ends)
    )
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
