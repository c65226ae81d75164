"""The rows of a ragged flow batch: their lengths, and the key masks and cache cuts they imply
(docs/vocoder.md, "Ragged batching")."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor


def key_mask(
    pad_before: Sequence[int], valid: Sequence[int], total: int, device: torch.device
) -> Tensor:
    """(B, total) bool: row b's keys pad_before[b] .. pad_before[b] + valid[b] - 1 are real."""
    index = torch.arange(total, device=device)[None]
    start = torch.tensor(pad_before, device=device)[:, None]
    stop = start + torch.tensor(valid, device=device)[:, None]
    return (index >= start) & (index < stop)


def cut_context(h: Tensor, context: int, ends: Sequence[int] | None) -> Tensor:
    """The `context` frames a causal conv keeps for the next chunk, (B, C, T) -> (B, C, context):
    the last ones, or with `ends` those before row b's own end (its real frames stop at
    ends[b] + context, its padding follows)."""
    if ends is None:
        return h[..., -context:]
    return torch.stack([h[b, :, end : end + context] for b, end in enumerate(ends)])


@dataclasses.dataclass(frozen=True)
class EncoderRows:
    """A ragged conformer call: row b has fresh[b] new tokens (its window less the lookahead,
    or all of it on the last chunk) and cached[b] tokens in its attention caches. Its cache is
    left-padded to the longest, so a query keeps its distance to every real key."""

    fresh: tuple[int, ...]
    cached: tuple[int, ...]

    @property
    def top(self) -> int:
        """The padded cache length, in tokens."""
        return max(self.cached)

    def keys(self, scale: int, width: int, device: torch.device) -> Tensor:
        """(B, scale * top + width): each row's real keys at `scale` frames per token (1: the
        token-rate layers, ratio: the mel-rate ones) over [left-padded cache, chunk]."""
        cached = [scale * tokens for tokens in self.cached]
        return key_mask(
            [scale * self.top - c for c in cached],
            [c + scale * n for c, n in zip(cached, self.fresh, strict=True)],
            scale * self.top + width,
            device,
        )

    def ends(self, scale: int) -> list[int]:
        """Where each row's new frames end, at `scale` frames per token."""
        return [scale * n for n in self.fresh]

    def id_mask(self, width: int, last_chunk: bool, lookahead: int, like: Tensor) -> Tensor:
        """(B, width, 1): 1 over each row's ids (fresh + lookahead, or fresh on the last
        chunk), 0 over its padding, so a short last chunk sees the zeros a solo call pads."""
        ids = [n if last_chunk else n + lookahead for n in self.fresh]
        index = torch.arange(width, device=like.device)[None]
        return (index < torch.tensor(ids, device=like.device)[:, None]).to(like.dtype)[:, :, None]


@dataclasses.dataclass(frozen=True, eq=False)
class ChunkRows:
    """A ragged DiT call over N rows: `keys` (N, F + T) marks each row's real keys over
    [chunk, cache], both right-padded (the DiT's attention has no positions); `ends` each row's
    real frames in the chunk, where its conv caches are cut."""

    keys: Tensor
    ends: tuple[int, ...]
