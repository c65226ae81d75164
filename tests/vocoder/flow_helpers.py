"""Helpers shared by the flow tests (imported after pytest.importorskip("torch"))."""

from __future__ import annotations

import torch

from codeclog.vocoder.flow import FlowState, Token2WavFlow

PROMPT_TOKENS = 12


def prompt(flow: Token2WavFlow, seed: int, tokens: int = PROMPT_TOKENS) -> FlowState:
    """A seeded random voice prompt: `tokens` ids, twice as many mel frames, a speaker vector."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, flow.config.vocab_size, (tokens,), generator=g)
    mel = torch.randn(2 * tokens, flow.config.mel_dim, generator=g)
    return flow.prepare_prompt(ids, mel, torch.randn(flow.config.spk_embed_dim, generator=g))
