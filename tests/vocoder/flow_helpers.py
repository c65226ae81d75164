"""Helpers shared by the flow tests (imported after pytest.importorskip("torch"))."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from codeclog.vocoder.flow import FlowConfig, FlowState, Token2WavFlow

PROMPT_TOKENS = 12


def tiny_flow(**changes: Any) -> Token2WavFlow:
    """The tiny flow, its config changed by `changes` (e.g. fewer ODE steps: n_timesteps=4)."""
    return Token2WavFlow(dataclasses.replace(FlowConfig.tiny(), **changes))


def random_ids(seed: int, *shape: int) -> torch.Tensor:
    """Seeded codec ids (0..6560) of `shape`."""
    return torch.randint(0, 6561, shape, generator=torch.Generator().manual_seed(seed))


def prompt(flow: Token2WavFlow, seed: int, tokens: int = PROMPT_TOKENS) -> FlowState:
    """A seeded random voice prompt: `tokens` ids, twice as many mel frames, a speaker vector."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, flow.config.vocab_size, (tokens,), generator=g)
    mel = torch.randn(2 * tokens, flow.config.mel_dim, generator=g)
    return flow.prepare_prompt(ids, mel, torch.randn(flow.config.spk_embed_dim, generator=g))
