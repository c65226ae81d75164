"""Scheme A's streaming rule, upstream's: every window vocoded with the 8 mel frames before it,
cross-faded with the held tail (docs/vocoder.md, "HiFT, scheme A")."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from codeclog.vocoder.hift.config import HiftConfig
from codeclog.vocoder.hift.excitation import draw_source_noise
from codeclog.vocoder.hift.noncausal import HiFTGenerator
from codeclog.vocoder.hift.rows import HiftRows
from codeclog.vocoder.hift.window_functions import fade_window


@dataclasses.dataclass(frozen=True)
class HiftCache:
    """Per-request vocoder state between windows (no batch dimension).

    mel: (80, M) the last M <= 8 mel frames given to HiFT, re-vocoded with the next window.
    source: (S,) the NSF excitation of those frames, S = M * 480.
    speech: (H,) samples vocoded but not yet emitted (the hold-back), H = M * 480; the next
        window cross-fades its first H samples with them.
    """

    mel: Tensor
    source: Tensor
    speech: Tensor

    @classmethod
    def empty(cls, config: HiftConfig, device: torch.device | str = "cpu") -> HiftCache:
        mel = torch.zeros(config.in_channels, 0, device=device)
        return cls(mel, torch.zeros(0, device=device), torch.zeros(0, device=device))

    @property
    def held_samples(self) -> int:
        return int(self.speech.shape[0])

    def signature(self) -> tuple[int, int, int]:
        """Caches with equal signatures can be vocoded in one HiFT call."""
        return (int(self.mel.shape[1]), int(self.source.shape[0]), int(self.speech.shape[0]))


def cross_fade(speech: Tensor, previous_tail: Tensor) -> Tensor:
    """Fade the first H samples of `speech` (B, N) in against `previous_tail` (B, H) fading out.

    Upstream multiplies float32 audio by the float64 window, so the sum is computed in float64
    and rounded once when stored back into float32; we do the same on purpose, for bit parity.
    With H < 3840 (only after a first window shorter than 8 mel frames; upstream raises a
    shape error there) the window is np.hamming(2H): the same shape, shorter.
    """
    overlap = previous_tail.shape[1]
    window = fade_window(overlap, speech.device)
    faded = speech[:, :overlap] * window[:overlap] + previous_tail * window[overlap:]
    out = speech.clone()
    out[:, :overlap] = faded
    return out


@dataclasses.dataclass(frozen=True)
class StreamStep:
    """Result of one scheme-A step for a batch: emitted audio per row and the new caches."""

    audio: list[Tensor]  # (samples,) float32 per row, on the model's device
    caches: list[HiftCache]


def stream_step(
    hift: HiFTGenerator,
    caches: Sequence[HiftCache],
    mel: Tensor,
    final: bool,
    noise_seeds: Sequence[int],
) -> StreamStep:
    """Vocode one window for B requests whose caches have equal signatures.

    mel: (B, 80, F) new mel frames. Per row: N = (M + F) * 480 samples are vocoded (M = cached
    frames); the first H = M * 480 are cross-faded with the held tail; a non-final step emits
    N - min(3840, N) samples and holds the rest, a final step emits all N. Hence a row emits
    H_before + F*480 - H_after samples, and a whole stream emits exactly its mel frames * 480.
    """
    if len({cache.signature() for cache in caches}) != 1:
        raise ValueError("stream_step needs caches of equal shape; group rows first")
    return _step(hift, caches, list(mel), final, noise_seeds, ragged=False)


def stream_step_ragged(
    hift: HiFTGenerator,
    caches: Sequence[HiftCache],
    mels: Sequence[Tensor],
    final: bool,
    noise_seeds: Sequence[int],
) -> StreamStep:
    """`stream_step` for B rows of any cache and window lengths in one call; mels[b] is
    (80, F_b). Each row within rounding of its solo step (vocoder.hift.rows)."""
    return _step(hift, caches, mels, final, noise_seeds, ragged=True)


def _step(
    hift: HiFTGenerator,
    caches: Sequence[HiftCache],
    mels: Sequence[Tensor],
    final: bool,
    noise_seeds: Sequence[int],
    ragged: bool,
) -> StreamStep:
    """Scheme A for B rows: their cached then new mel in one HiFT call, then per row the
    cross-fade, the hold-back and the new caches."""
    config = hift.config
    rows = [torch.cat([c.mel.to(m.dtype), m], dim=1) for c, m in zip(caches, mels, strict=True)]
    frames = [int(row.shape[1]) for row in rows]
    cached = [int(cache.source.shape[0]) for cache in caches]
    mel_in = torch.stack([F.pad(row, (0, max(frames) - row.shape[1])) for row in rows])
    samples = [count * config.samples_per_frame for count in frames]
    noise = draw_source_noise(noise_seeds, samples, config.nb_harmonics + 1, mel_in.device)
    cache_source = torch.stack(
        [F.pad(c.source, (0, max(cached) - n)) for c, n in zip(caches, cached, strict=True)]
    )
    if ragged:
        layout = HiftRows(tuple(frames), tuple(cached))
        speech, source = hift(mel_in, cache_source.unsqueeze(1), noise, layout)
    else:
        speech, source = hift(mel_in, cache_source.unsqueeze(1), noise)
    audio, new_caches = [], []
    for b, (cache, total) in enumerate(zip(caches, samples, strict=True)):
        row = speech[b : b + 1, :total]
        if cache.held_samples:
            row = cross_fade(row, cache.speech[None])
        keep = min(config.cache_samples, total)
        start = total - keep
        new_caches.append(
            HiftCache(
                mel=rows[b][:, -config.mel_cache_frames :].clone(),
                source=source[b, 0, start:total].clone(),
                speech=row[0, start:].clone(),
            )
        )
        audio.append((row[0] if final else row[0, :start]).clone())
    return StreamStep(audio=audio, caches=new_caches)
