"""Ragged HiFT: one call for windows of different lengths and different held caches.

`hift.stream_step` vocodes rows of equal shape only. Here each row's mel (its cached frames then
its new frames) is right-padded with zeros to the widest row, its excitation noise is drawn at
its own length (so it equals the solo draw) and zero-padded, its cached excitation replaces its
own first samples, and its audio, cross-fade and new caches are cut at its own end. HiFT is
non-causal, so every convolution's output is zeroed past each row's end (a solo call pads
with zeros there too), as are the excitation and the iSTFT magnitudes of padded frames. What
remains different is only where a solo call reflects or clamps at its own end (the STFT's
reflect padding, the sine phase interpolation, the iSTFT window envelope): a few samples at a
row's end, measured in docs/vocoder.md ("Ragged batching").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from codeclog.vocoder.hift import (
    HiftCache,
    HiFTGenerator,
    SourceNoise,
    StreamStep,
    cross_fade,
    draw_source_noise,
    filter_stages,
)


def stream_step_ragged(
    hift: HiFTGenerator,
    caches: Sequence[HiftCache],
    mels: Sequence[Tensor],
    final: bool,
    noise_seeds: Sequence[int],
) -> StreamStep:
    """Scheme A for B rows of any cache and window lengths; mels[b] is (80, F_b)."""
    config = hift.config
    per_frame = config.samples_per_frame
    rows = [torch.cat([c.mel.to(m.dtype), m], dim=1) for c, m in zip(caches, mels, strict=True)]
    frames = [int(r.shape[1]) for r in rows]
    width = max(frames)
    mel_in = torch.stack([F.pad(r, (0, width - r.shape[1])) for r in rows])
    samples = [f * per_frame for f in frames]
    noise = _ragged_noise(noise_seeds, samples, width * per_frame, config.nb_harmonics + 1, mel_in)
    with _masked_convs(hift, frames, width):
        f0 = hift.f0_predictor(mel_in)
        upsampled = F.interpolate(f0[:, None], scale_factor=float(per_frame))
        source = _source(hift, upsampled.transpose(1, 2), noise, frames).transpose(1, 2)
        source = source * _mask(samples, width * per_frame, source)[:, None, :]
        for b, cache in enumerate(caches):
            if cache.source.shape[0]:
                source[b, 0, : cache.source.shape[0]] = cache.source
        _reflect_ends(source, samples, hift.config.istft_n_fft // 2)
        speech = _decode(hift, mel_in, source, frames, width)
    audio, new_caches = [], []
    for b, cache in enumerate(caches):
        total = samples[b]
        row = speech[b : b + 1, :total]
        if cache.held_samples:
            row = cross_fade(row, cache.speech[None])
        keep = min(config.cache_samples, total)
        start = total - config.cache_samples if total > config.cache_samples else 0
        new_caches.append(
            HiftCache(
                mel=rows[b][:, -config.mel_cache_frames :].clone(),
                source=source[b, 0, start:total].clone(),
                speech=row[0, start:].clone(),
            )
        )
        audio.append((row[0] if final else row[0, : total - keep]).clone())
    return StreamStep(audio=audio, caches=new_caches)


def _ragged_noise(
    seeds: Sequence[int], samples: Sequence[int], width: int, harmonics: int, like: Tensor
) -> SourceNoise:
    phases, gaussians = [], []
    for seed, count in zip(seeds, samples, strict=True):
        drawn = draw_source_noise([seed], count, harmonics, like.device)
        phases.append(drawn.phase[0])
        gaussians.append(F.pad(drawn.gaussian[0], (0, 0, 0, width - count)))
    return SourceNoise(torch.stack(phases), torch.stack(gaussians))


def _mask(valid: Sequence[int], size: int, like: Tensor) -> Tensor:
    """(B, size): 1 before each row's `valid` length, 0 after."""
    index = torch.arange(size, device=like.device)[None]
    return (index < torch.tensor(list(valid), device=like.device)[:, None]).to(like.dtype)


@contextlib.contextmanager
def _masked_convs(hift: HiFTGenerator, frames: Sequence[int], width: int) -> Iterator[None]:
    """Zero every convolution's output past each row's end while the block runs. A tensor of
    length s * width (+ 1 after the last stage's reflection pad) is at s samples per mel frame,
    so row b is valid for its first s * frames[b] (+ 1) positions (width >= 2: a window has at
    least 2 mel frames)."""

    def hook(module: nn.Module, inputs: object, output: Tensor) -> Tensor:
        size = output.shape[-1]
        scale = size // width
        valid = [size - (width - f) * scale for f in frames]
        return output * _mask(valid, size, output)[:, None, :]

    convs = (nn.Conv1d, nn.ConvTranspose1d)
    handles = [m.register_forward_hook(hook) for m in hift.modules() if isinstance(m, convs)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _decode(
    hift: HiFTGenerator, mel: Tensor, source: Tensor, frames: Sequence[int], width: int
) -> Tensor:
    """HiFTGenerator.decode with the iSTFT magnitudes of each row's padded frames zeroed."""
    config = hift.config
    real, imag = hift._stft(source.squeeze(1))
    s_stft = torch.cat([real, imag], dim=1)
    stft_size = s_stft.shape[2]
    valid_stft = [stft_size - (width - f) * (stft_size // width) for f in frames]
    s_stft = s_stft * _mask(valid_stft, stft_size, s_stft)[:, None, :]
    x = hift.conv_pre(mel)
    x = filter_stages(hift, x, s_stft, config)
    bins = config.istft_n_fft // 2 + 1
    stft_frames = x.shape[2]
    valid = [stft_frames - (width - f) * (stft_frames // width) for f in frames]
    magnitude = torch.exp(x[:, :bins, :]) * _mask(valid, stft_frames, x)[:, None, :]
    speech = hift._istft(magnitude, torch.sin(x[:, bins:, :]))
    _solo_envelope(speech, valid, stft_frames, hift.window(speech.device), config.istft_hop)
    return torch.clamp(speech, -config.audio_limit, config.audio_limit)


def _solo_envelope(
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


def _reflect_ends(source: Tensor, samples: Sequence[int], pad: int) -> None:
    """Write each row's reflect padding right after its end, in place, as the STFT of a solo
    call (center=True, reflect) sees it: source[n + k] = source[n - 2 - k]."""
    for b, count in enumerate(samples):
        room = min(pad, source.shape[2] - count, count - 1)
        if room > 0:
            source[b, 0, count : count + room] = source[b, 0, count - 1 - room : count - 1].flip(0)


def _source(hift: HiFTGenerator, f0: Tensor, noise: SourceNoise, frames: Sequence[int]) -> Tensor:
    """SourceModuleHnNSF2 with SineGen2's frame-rate phase held at each row's last frame past
    its end (a solo call's linear interpolation clamps there)."""
    module = hift.m_source
    gen = module.l_sin_gen
    harmonics = torch.arange(1, gen.dim + 1, dtype=torch.float32, device=f0.device)
    fn = torch.multiply(f0, harmonics.view(1, 1, -1))
    rad_values = (fn / gen.sampling_rate) % 1
    rand_ini = noise.phase.clone()
    rand_ini[:, 0] = 0
    rad_values[:, 0, :] = rad_values[:, 0, :] + rand_ini
    rad_values = F.interpolate(
        rad_values.transpose(1, 2), scale_factor=1 / gen.upsample_scale, mode="linear"
    ).transpose(1, 2)
    phases = torch.cumsum(rad_values, dim=1) * 2 * torch.pi
    for b, count in enumerate(frames):
        phases[b, count:] = phases[b, count - 1]
    phases = F.interpolate(
        phases.transpose(1, 2) * gen.upsample_scale,
        scale_factor=float(gen.upsample_scale),
        mode="linear",
    ).transpose(1, 2)
    sine_waves = torch.sin(phases) * gen.sine_amp
    uv = (f0 > gen.voiced_threshold).type(torch.float32)
    noise_amp = uv * gen.noise_std + (1 - uv) * gen.sine_amp / 3
    return module.l_tanh(module.l_linear(sine_waves * uv + noise_amp * noise.gaussian))
