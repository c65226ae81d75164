"""The rows of a ragged HiFT call, and the masks that keep each row equal to its solo call
(docs/vocoder.md, "Ragged batching")."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn

from codeclog.vocoder.shared import thread_setting


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


_ROWS = threading.local()  # the rows of the ragged call this thread is running, if any
_HOOKED = "_codeclog_row_masks"  # set on a module whose convolutions carry the hook
_HOOKING = threading.Lock()


def _mask_rows(conv: nn.Module, inputs: object, output: Tensor) -> Tensor | None:
    """Every convolution's forward hook: zero its output past each row's end, where this
    thread runs a ragged call (None: the output as it is)."""
    rows: HiftRows | None = getattr(_ROWS, "rows", None)
    if rows is None:
        return None
    return output * rows.mask(output.shape[-1], output)[:, None, :]


@contextlib.contextmanager
def masked_convs(module: nn.Module, rows: HiftRows | None) -> Iterator[None]:
    """Zero every convolution's output past each row's end while the block runs in this thread
    (nothing without rows). The hooks stay on the module and read the rows of their own
    thread, so decode workers running ragged slices of one module at once never see each
    other's rows."""
    if rows is None:
        yield
        return
    _hook_convs(module)
    with thread_setting(_ROWS, "rows", rows):
        yield


def _hook_convs(module: nn.Module) -> None:
    with _HOOKING:
        if getattr(module, _HOOKED, False):
            return
        convs = (nn.Conv1d, nn.ConvTranspose1d)
        for conv in module.modules():
            if isinstance(conv, convs):
                conv.register_forward_hook(_mask_rows)
        setattr(module, _HOOKED, True)


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
