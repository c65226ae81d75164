"""The rows of a ragged HiFT call, and the masks that keep each row equal to its solo call.

`hift_stream.stream_step` vocodes rows of equal shape only; `stream_step_ragged` runs the same
generator over rows of any cache and window lengths, given their `HiftRows`. Each row's mel (its
cached frames then its new frames) is right-padded with zeros to the widest row, its excitation
noise is drawn at its own length (so it equals the solo draw) and zero-padded, its cached
excitation replaces its own first samples, and its audio, cross-fade and new caches are cut at
its own end. HiFT is non-causal, so every convolution's output is zeroed past each row's end (a
solo call pads with zeros there too), as are the excitation and the iSTFT magnitudes of padded
frames. What remains different is only where a solo call reflects or clamps at its own end (the
STFT's reflect padding, the sine phase interpolation, the iSTFT window envelope): a few samples
at a row's end, measured in docs/vocoder.md ("Ragged batching").
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn


@dataclasses.dataclass(frozen=True)
class HiftRows:
    """frames[b]: row b's mel frames (cached then new; the batch is padded to the widest);
    cached[b]: the samples of its cached excitation."""

    frames: tuple[int, ...]
    cached: tuple[int, ...]

    @property
    def width(self) -> int:
        return max(self.frames)

    def valid(self, size: int) -> list[int]:
        """Each row's real positions along an axis of `size` = s * width (+ a few: the last
        stage's reflection pad adds 1) at s positions per mel frame (width >= 2: a window has
        at least 2 mel frames)."""
        scale = size // self.width
        return [size - (self.width - frames) * scale for frames in self.frames]

    def mask(self, size: int, like: Tensor) -> Tensor:
        """(B, size): 1 over each row's real positions (`valid`), 0 after."""
        return sample_mask(self.valid(size), size, like)


def sample_mask(valid: Sequence[int], size: int, like: Tensor) -> Tensor:
    """(B, size): 1 before each row's `valid` length, 0 after."""
    index = torch.arange(size, device=like.device)[None]
    return (index < torch.tensor(list(valid), device=like.device)[:, None]).to(like.dtype)


@contextlib.contextmanager
def masked_convs(module: nn.Module, rows: HiftRows | None) -> Iterator[None]:
    """Zero every convolution's output past each row's end while the block runs (nothing
    without rows)."""

    def hook(conv: nn.Module, inputs: object, output: Tensor) -> Tensor:
        assert rows is not None
        return output * rows.mask(output.shape[-1], output)[:, None, :]

    convs = (nn.Conv1d, nn.ConvTranspose1d)
    targets = [m for m in module.modules() if isinstance(m, convs)] if rows is not None else []
    handles = [m.register_forward_hook(hook) for m in targets]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def hold_phase(phases: Tensor, rows: HiftRows) -> None:
    """In place: the frame-rate phases (B, width, harmonics) of each row held at its last frame
    past its end (a solo call's linear interpolation clamps there)."""
    for b, count in enumerate(rows.frames):
        phases[b, count:] = phases[b, count - 1]


def reflect_ends(source: Tensor, samples: Sequence[int], pad: int) -> None:
    """Write each row's reflect padding right after its end, in place, as the STFT of a solo
    call (center=True, reflect) sees it: source[n + k] = source[n - 2 - k]."""
    for b, count in enumerate(samples):
        room = min(pad, source.shape[2] - count, count - 1)
        if room > 0:
            source[b, 0, count : count + room] = source[b, 0, count - 1 - room : count - 1].flip(0)


def solo_envelope(
    speech: Tensor, frames: Sequence[int], total: int, window: Tensor, hop: int
) -> None:
    """In place: torch.istft divides by the squared-window envelope of ALL frames, so a row's
    last samples were divided by an envelope that includes its (zero) padded frames; rescale
    them to the envelope of the row's own frames, as its solo call computes it."""
    n_fft = window.shape[0]
    squared = (window.to(torch.float64) ** 2).tolist()
    for b, count in enumerate(frames):
        if count == total:
            continue
        end = (count - 1) * hop  # the row's samples after the center trim
        start = max(0, end - n_fft)
        ratios = []
        for q in range(start, end):
            p = q + n_fft // 2
            own = sum(squared[p - f * hop] for f in range(count) if 0 <= p - f * hop < n_fft)
            every = sum(squared[p - f * hop] for f in range(total) if 0 <= p - f * hop < n_fft)
            ratios.append(every / own if own > 1e-11 else 1.0)
        scale = torch.tensor(ratios, dtype=speech.dtype, device=speech.device)
        speech[b, start:end] = speech[b, start:end] * scale
