"""Scheme A's NSF excitation with its randomness an input: `SourceNoise`, `draw_source_noise` and
upstream's `SineGen2`, `SourceModuleHnNSF2` (docs/vocoder.md, "Randomness and determinism")."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from codeclog.vocoder.hift.config import HiftConfig
from codeclog.vocoder.hift.rows import HiftRows, hold_phase


@dataclasses.dataclass(frozen=True)
class SourceNoise:
    """The randomness of one HiFT call, drawn by the caller.

    phase: (B, nb_harmonics + 1) uniform [0, 1) start phases in cycles; column 0 (the
        fundamental) is ignored, as upstream zeroes it.
    gaussian: (B, samples, nb_harmonics + 1) standard normal noise added to the sines.
    """

    phase: Tensor
    gaussian: Tensor


def draw_source_noise(
    seeds: Sequence[int],
    samples: int | Sequence[int],
    harmonics: int,
    device: torch.device | str = "cpu",
) -> SourceNoise:
    """One CPU generator per row, seeded by that row's seed: a row's noise never depends on its
    batch mates, the device or the global RNG. Draw order per row: phase, then gaussian.
    `samples`: every row's count, or each row's (a ragged call: each row drawn at its own
    length, then zero-padded to the longest). (Upstream's own draws are not reproduced: they
    come from the global RNG, and `randn_like` on its transposed operand takes torch's serial
    normal path; the parity test rebuilds them.)"""
    counts = [samples] * len(seeds) if isinstance(samples, int) else list(samples)
    longest = max(counts, default=0)
    phases: list[Tensor] = []
    gaussians: list[Tensor] = []
    for seed, count in zip(seeds, counts, strict=True):
        generator = torch.Generator(device="cpu").manual_seed(seed)
        phases.append(torch.rand(harmonics, generator=generator))
        gaussian = torch.randn(count, harmonics, generator=generator)
        gaussians.append(
            F.pad(gaussian, (0, 0, 0, longest - count)) if count < longest else gaussian
        )
    return SourceNoise(torch.stack(phases).to(device), torch.stack(gaussians).to(device))


class SineGen2(nn.Module):
    """NSF sine source (upstream `SineGen2`, flag_for_pulse=False), noise from `SourceNoise`."""

    def __init__(self, config: HiftConfig) -> None:
        super().__init__()
        self.sine_amp = config.nsf_alpha
        self.noise_std = config.nsf_sigma
        self.dim = config.nb_harmonics + 1
        self.sampling_rate = config.sampling_rate_hz
        self.voiced_threshold = config.nsf_voiced_threshold_hz
        self.upsample_scale = config.samples_per_frame

    def _f02sine(self, f0_values: Tensor, phase: Tensor, rows: HiftRows | None) -> Tensor:
        rad_values = (f0_values / self.sampling_rate) % 1
        rand_ini = phase.clone()
        rand_ini[:, 0] = 0
        rad_values[:, 0, :] = rad_values[:, 0, :] + rand_ini
        # phase is integrated at frame rate and interpolated back: exactly upstream's call
        # sequence, because interpolate's coordinate mapping depends on scale_factor.
        rad_values = F.interpolate(
            rad_values.transpose(1, 2), scale_factor=1 / self.upsample_scale, mode="linear"
        ).transpose(1, 2)
        phases = torch.cumsum(rad_values, dim=1) * 2 * np.pi
        if rows is not None:
            hold_phase(phases, rows)
        phases = F.interpolate(
            phases.transpose(1, 2) * self.upsample_scale,
            scale_factor=float(self.upsample_scale),
            mode="linear",
        ).transpose(1, 2)
        return torch.sin(phases)

    def forward(self, f0: Tensor, noise: SourceNoise, rows: HiftRows | None = None) -> Tensor:
        """f0: (B, samples, 1) in Hz -> sine source (B, samples, dim); `rows`: a ragged call's."""
        harmonics = torch.arange(1, self.dim + 1, dtype=torch.float32, device=f0.device)
        fn = torch.multiply(f0, harmonics.view(1, 1, -1))
        sine_waves = self._f02sine(fn, noise.phase, rows) * self.sine_amp
        uv = (f0 > self.voiced_threshold).type(torch.float32)
        noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
        return sine_waves * uv + noise_amp * noise.gaussian


class SourceModuleHnNSF2(nn.Module):
    """Harmonic-plus-noise source: sines merged to one excitation by a linear + tanh."""

    def __init__(self, config: HiftConfig) -> None:
        super().__init__()
        self.l_sin_gen = SineGen2(config)
        self.l_linear = nn.Linear(config.nb_harmonics + 1, 1)
        self.l_tanh = nn.Tanh()

    def forward(self, f0: Tensor, noise: SourceNoise, rows: HiftRows | None = None) -> Tensor:
        return self.l_tanh(self.l_linear(self.l_sin_gen(f0, noise, rows)))
