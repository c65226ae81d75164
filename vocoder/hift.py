"""HiFT (NSF + iSTFTNet) vocoder and its upstream streaming rule ("scheme A").

The module tree reproduces `stepaudio2.flashcosyvoice.modules.hifigan.HiFTGenerator` (as used by
`stepaudio2-minicpmo` 0.1.1 and `minicpmo-utils` 1.0.5/1.0.7) so the published `hift.pt` loads
with `strict=True` (after stripping a `generator.` prefix). Two differences, both on purpose:

- Randomness is an input. Upstream draws the harmonic start phases (`torch.rand`) and the
  additive source noise (`torch.randn_like`) from the global RNG on every call, so in a batch a
  request's audio depends on its batch mates and on whatever else used the RNG. Here the caller
  passes a `SourceNoise` (see `draw_source_noise`, one seeded generator per row). Upstream also
  draws an unused noise branch (`SourceModuleHnNSF2` returns it, `HiFTGenerator` drops it); we
  do not draw it, which changes nothing audible.
- Sizes come from `HiftConfig`, so a tiny model runs the same code on a 2-core CPU.

Streaming (scheme A, `stream_step`): every window is vocoded together with the previous 8 mel
frames; the NSF excitation of those frames is replaced by the cached excitation, the first
overlap samples are cross-faded with the held previous tail by a Hamming window, and the last
3840 samples are held back until the next window (all released on the final window).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

from codeclog.vocoder.errors import VocoderConfigError
from codeclog.vocoder.hift_ragged import (
    HiftRows,
    hold_phase,
    masked_convs,
    reflect_ends,
    solo_envelope,
)
from codeclog.vocoder.kernels import exactmath, portable_active

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11 on

UPSTREAM_PREFIX = "generator."  # hift.pt keys carry it when saved from the training wrapper


@dataclasses.dataclass(frozen=True)
class HiftConfig:
    """Every size of the HiFT generator and of its streaming rule. Defaults are the published
    sizes (`hift.pt` of Step-Audio2 / MiniCPM-o 4.5 `assets/token2wav`). The causal HiFT's
    config extends it (vocoder.causal_hift.CausalHiftConfig)."""

    KIND: ClassVar[str] = "HiFT"  # names the config in its errors

    in_channels: int = 80  # mel bins
    base_channels: int = 512  # channels after conv_pre; halved at every upsampling stage
    nb_harmonics: int = 8  # NSF overtones above F0 (the source has nb_harmonics + 1 sines)
    sampling_rate_hz: int = 24000
    nsf_alpha: float = 0.1  # sine amplitude
    nsf_sigma: float = 0.003  # noise std in voiced regions
    nsf_voiced_threshold_hz: float = 10.0  # F0 above this is voiced
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    istft_n_fft: int = 16
    istft_hop: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99  # output clamp
    f0_channels: int = 512  # width of the F0 predictor's conv stack
    f0_layers: int = 5  # convs in the F0 predictor (upstream: 5, kernel 3)
    mel_cache_frames: int = 8  # streaming: mel frames re-vocoded with the next window (160 ms)

    def __post_init__(self) -> None:
        stages = len(self.upsample_rates)
        if len(self.upsample_kernel_sizes) != stages:
            raise VocoderConfigError("upsample_rates and upsample_kernel_sizes differ in length")
        if len(self.source_resblock_kernel_sizes) != stages:
            raise VocoderConfigError("need one source resblock kernel per upsampling stage")
        if len(self.source_resblock_dilations) != stages:
            raise VocoderConfigError("need one source resblock dilation list per stage")
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilations):
            raise VocoderConfigError("resblock kernel sizes and dilations differ in length")
        if self.base_channels % (2**stages) or self.base_channels < 2**stages:
            raise VocoderConfigError(f"base_channels must be a multiple of {2**stages}")
        if min(self.in_channels, self.f0_channels, self.f0_layers, self.mel_cache_frames) < 1:
            raise VocoderConfigError("channel counts, f0_layers and mel_cache_frames must be >= 1")
        if self.sampling_rate_hz == 22050:
            # upstream switches to the older SourceModuleHnNSF at 22.05 kHz; not reproduced here
            raise VocoderConfigError("22050 Hz HiFT (SourceModuleHnNSF) is not supported")

    @property
    def samples_per_frame(self) -> int:
        """Output samples per mel frame (480 at the published sizes)."""
        return math.prod(self.upsample_rates) * self.istft_hop

    @property
    def cache_samples(self) -> int:
        """Samples of the source cache, of the speech hold-back and of the cross-fade (3840)."""
        return self.mel_cache_frames * self.samples_per_frame

    @classmethod
    def full(cls) -> Self:
        return cls()

    @classmethod
    def tiny(cls) -> Self:
        """Same interface (80 mels, 24 kHz, 480 samples per frame), fast on 2 CPU cores."""
        return cls(base_channels=16, f0_channels=16)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Self:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise VocoderConfigError(f"unknown {cls.KIND} config keys: {', '.join(unknown)}")
        return cls(**{key: _freeze(value) for key, value in raw.items()})


def _freeze(value: Any) -> Any:
    """JSON lists back to the tuples the frozen config uses."""
    if isinstance(value, list):
        return tuple(_freeze(item) for item in value)
    return value


def _padding(kernel_size: int, dilation: int = 1) -> int:
    return (kernel_size * dilation - dilation) // 2


def _wn_conv(cin: int, cout: int, kernel: int, dilation: int = 1, padding: int = 0) -> nn.Module:
    conv = nn.Conv1d(cin, cout, kernel, 1, dilation=dilation, padding=padding)
    return weight_norm(conv)


class Snake(nn.Module):
    """x + sin²(αx)/α with a learned per-channel α (BigVGAN), as upstream computes it:
    `x + (1 / (α + 1e-9)) * sin(x α)²`, with the per-channel factors computed once per value of
    α and the products and the sum done in place (the same IEEE operations on the same
    operands, so the same bytes: a square is a product, both are commutative)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))
        self._factors: tuple[tuple[int, int, torch.dtype], Tensor, Tensor] | None = None

    def forward(self, x: Tensor) -> Tensor:
        alpha, inverse = self._per_channel()
        waves = torch.sin(x * alpha)
        return waves.mul_(waves).mul_(inverse).add_(x)

    def _per_channel(self) -> tuple[Tensor, Tensor]:
        """α and 1 / (α + 1e-9) as (1, C, 1); kept while α is unchanged (no autograd)."""
        key = (self.alpha._version, self.alpha.data_ptr(), self.alpha.dtype)
        if torch.is_grad_enabled() or self._factors is None or self._factors[0] != key:
            alpha = self.alpha.unsqueeze(0).unsqueeze(-1)
            factors = (key, alpha, 1.0 / (alpha + 1e-9))
            if torch.is_grad_enabled():  # kept tensors would be inference tensors or a graph's
                return factors[1], factors[2]
            self._factors = factors
        return self._factors[1], self._factors[2]


class ResBlock(nn.Module):
    """Residual block of dilated convs with Snake activations (upstream `ResBlock`)."""

    def __init__(self, channels: int, kernel_size: int, dilations: Sequence[int]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            _wn_conv(channels, channels, kernel_size, d, _padding(kernel_size, d))
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            _wn_conv(channels, channels, kernel_size, 1, _padding(kernel_size)) for _ in dilations
        )
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: Tensor) -> Tensor:
        for conv1, conv2, act1, act2 in zip(
            self.convs1, self.convs2, self.activations1, self.activations2, strict=True
        ):
            x = conv2(act2(conv1(act1(x)))) + x
        return x


class ConvRNNF0Predictor(nn.Module):
    """Mel -> F0 in Hz per frame: a stack of k=3 convs with ELU, then a linear head."""

    def __init__(self, in_channels: int, channels: int, layers: int) -> None:
        super().__init__()
        stack: list[nn.Module] = []
        for index in range(layers):
            stack.append(_wn_conv(in_channels if index == 0 else channels, channels, 3, 1, 1))
            stack.append(nn.ELU())
        self.condnet = nn.Sequential(*stack)
        self.classifier = nn.Linear(channels, 1)

    def forward(self, mel: Tensor) -> Tensor:
        x = self.condnet(mel).transpose(1, 2)
        return torch.abs(self.classifier(x).squeeze(-1))


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


def _hann_periodic(n_fft: int) -> Tensor:
    """scipy.signal.get_window("hann", n, fftbins=True) with scipy's own arithmetic, in float32
    (upstream builds its iSTFT window that way; scipy is not a dependency here). Under portable
    kernels numpy's cos (vectorised differently by CPU) is replaced by the portable one."""
    fac = np.linspace(-np.pi, np.pi, n_fft + 1)
    window = np.zeros(n_fft + 1)
    for k, coefficient in enumerate((0.5, 0.5)):
        window += coefficient * _cos(k * fac)
    return torch.from_numpy(window[:-1].astype(np.float32))


def _cos(values: np.ndarray) -> np.ndarray:
    if not portable_active():
        return np.cos(values)
    return exactmath.cos(torch.from_numpy(np.asarray(values, dtype=np.float64))).numpy()


class HiFTGenerator(nn.Module):
    """HiFTNet generator: NSF source + iSTFTNet (upstream parameter names and shapes)."""

    def __init__(self, config: HiftConfig) -> None:
        super().__init__()
        self.config = config
        self.m_source = SourceModuleHnNSF2(config)
        self.conv_pre = _wn_conv(config.in_channels, config.base_channels, 7, 1, 3)
        self.ups = nn.ModuleList(_up_layers(config))
        self.source_downs = source_downs(config, _pointwise, _strided)
        self.source_resblocks, self.resblocks = resblock_stacks(config, ResBlock)
        last = config.base_channels // 2 ** len(config.upsample_rates)
        self.conv_post = _wn_conv(last, config.istft_n_fft + 2, 7, 1, 3)
        self.reflection_pad = nn.ReflectionPad1d((1, 0))
        self.f0_predictor = ConvRNNF0Predictor(
            config.in_channels, config.f0_channels, config.f0_layers
        )
        # a plain attribute as upstream (not in the state dict); moved with the input
        self.stft_window = _hann_periodic(config.istft_n_fft)
        self._portable_window: Tensor | None = None

    def window(self, device: torch.device) -> Tensor:
        """The STFT window; under portable kernels the portably computed one."""
        if not portable_active():
            return self.stft_window.to(device)
        if self._portable_window is None:
            self._portable_window = _hann_periodic(self.config.istft_n_fft)
        return self._portable_window.to(device)

    def _stft(self, x: Tensor) -> tuple[Tensor, Tensor]:
        n_fft, hop = self.config.istft_n_fft, self.config.istft_hop
        window = self.window(x.device)
        spec = torch.view_as_real(torch.stft(x, n_fft, hop, n_fft, window, return_complex=True))
        return spec[..., 0], spec[..., 1]

    def _istft(self, magnitude: Tensor, phase: Tensor) -> Tensor:
        n_fft, hop = self.config.istft_n_fft, self.config.istft_hop
        magnitude = torch.clip(magnitude, max=1e2)
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        return torch.istft(spec, n_fft, hop, n_fft, window=self.window(magnitude.device))

    def decode(self, mel: Tensor, source: Tensor, rows: HiftRows | None = None) -> Tensor:
        """Filter network: mel (B, 80, T) and excitation (B, 1, T*480) -> speech (B, T*480).
        With `rows` (a ragged call) the excitation's STFT and the iSTFT magnitudes of each
        row's padded frames are zeroed and its window envelope is its own."""
        real, imag = self._stft(source.squeeze(1))
        s_stft = torch.cat([real, imag], dim=1)
        if rows is not None:
            s_stft = s_stft * rows.mask(s_stft.shape[2], s_stft)[:, None, :]
        x = self.conv_pre(mel)
        x = filter_stages(self, x, s_stft, self.config)
        bins = self.config.istft_n_fft // 2 + 1
        magnitude = torch.exp(x[:, :bins, :])
        if rows is not None:
            magnitude = magnitude * rows.mask(x.shape[2], x)[:, None, :]
        speech = self._istft(magnitude, torch.sin(x[:, bins:, :]))
        if rows is not None:
            window = self.window(speech.device)
            solo_envelope(speech, rows.valid(x.shape[2]), x.shape[2], window, self.config.istft_hop)
        return torch.clamp(speech, -self.config.audio_limit, self.config.audio_limit)

    def forward(
        self, mel: Tensor, cache_source: Tensor, noise: SourceNoise, rows: HiftRows | None = None
    ) -> tuple[Tensor, Tensor]:
        """mel (B, 80, T), cache_source (B, 1, S) with S <= T*480 (S = 0: none) ->
        (speech (B, T*480), excitation (B, 1, T*480)). The first S excitation samples are
        replaced by the cache so the re-vocoded overlap keeps the previous window's source.
        With `rows` a ragged call (vocoder.hift_ragged): mel right-padded, row b's cache its
        first rows.cached[b] samples, every row vocoded as if alone (within rounding)."""
        with masked_convs(self, rows):
            f0 = self.f0_predictor(mel)
            per_frame = self.config.samples_per_frame
            upsampled = F.interpolate(f0[:, None], scale_factor=float(per_frame))
            source = self.m_source(upsampled.transpose(1, 2), noise, rows).transpose(1, 2)
            if rows is None:
                if cache_source.shape[2] != 0:
                    source[:, :, : cache_source.shape[2]] = cache_source
            else:
                source = source * rows.mask(source.shape[2], source)[:, None, :]
                for b, count in enumerate(rows.cached):
                    source[b, :, :count] = cache_source[b, :, :count]
                ends = [frames * per_frame for frames in rows.frames]
                reflect_ends(source, ends, self.config.istft_n_fft // 2)
            return self.decode(mel, source, rows), source


class FilterStages(Protocol):
    """The modules of the filter network both HiFT variants share (same names, same calls)."""

    ups: nn.ModuleList
    reflection_pad: nn.ReflectionPad1d
    source_downs: nn.ModuleList
    source_resblocks: nn.ModuleList
    resblocks: nn.ModuleList
    conv_post: nn.Module


def filter_stages(hift: FilterStages, x: Tensor, s_stft: Tensor, config: StageSizes) -> Tensor:
    """From conv_pre's output through conv_post: each upsampling stage adds the excitation's
    STFT brought to its rate and averages its resblocks. One body for the noncausal, ragged
    and causal decodes: their bytes depend on this exact order of operations."""
    stages = len(hift.ups)
    kernels = len(config.resblock_kernel_sizes)
    for i in range(stages):
        x = hift.ups[i](F.leaky_relu(x, config.lrelu_slope))
        if i == stages - 1:
            x = hift.reflection_pad(x)
        x = x + hift.source_resblocks[i](hift.source_downs[i](s_stft))
        xs = hift.resblocks[i * kernels](x)
        for j in range(1, kernels):
            xs += hift.resblocks[i * kernels + j](x)
        x = xs / kernels
    return hift.conv_post(F.leaky_relu(x))


def _up_layers(config: HiftConfig) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for i, (rate, kernel) in enumerate(
        zip(config.upsample_rates, config.upsample_kernel_sizes, strict=True)
    ):
        cin, cout = config.base_channels // 2**i, config.base_channels // 2 ** (i + 1)
        conv = nn.ConvTranspose1d(cin, cout, kernel, rate, padding=(kernel - rate) // 2)
        layers.append(weight_norm(conv))
    return layers


class StageSizes(Protocol):
    """The settings both HiFT variants' filter networks are built and run with."""

    @property
    def base_channels(self) -> int: ...
    @property
    def upsample_rates(self) -> tuple[int, ...]: ...
    @property
    def resblock_kernel_sizes(self) -> tuple[int, ...]: ...
    @property
    def resblock_dilations(self) -> tuple[tuple[int, ...], ...]: ...
    @property
    def source_resblock_kernel_sizes(self) -> tuple[int, ...]: ...
    @property
    def source_resblock_dilations(self) -> tuple[tuple[int, ...], ...]: ...
    @property
    def lrelu_slope(self) -> float: ...


def resblock_stacks(
    config: StageSizes, block: Callable[[int, int, tuple[int, ...]], nn.Module]
) -> tuple[nn.ModuleList, nn.ModuleList]:
    """The source resblocks (one per upsampling stage) and the resblocks (one per kernel size
    per stage), in the order and with the channels the checkpoints' parameter names expect;
    `block` is the variant's ResBlock class."""
    stages = range(len(config.upsample_rates))
    source = zip(config.source_resblock_kernel_sizes, config.source_resblock_dilations, strict=True)
    kernels = list(zip(config.resblock_kernel_sizes, config.resblock_dilations, strict=True))
    channels = [config.base_channels // 2 ** (i + 1) for i in stages]
    return (
        nn.ModuleList(block(channels[i], k, d) for i, (k, d) in enumerate(source)),
        nn.ModuleList(block(channels[i], k, d) for i in stages for k, d in kernels),
    )


def source_downs(
    config: HiftConfig,
    pointwise: Callable[[int, int], nn.Module],
    strided: Callable[[int, int, int], nn.Module],
) -> nn.ModuleList:
    """The convs bringing the excitation STFT to each upsampling stage's rate: `pointwise`
    (in, out) where the rate is 1 (the last stage), `strided` (in, out, rate) elsewhere; the
    variant's layer classes (scheme A: plain convs, no weight norm upstream)."""
    downsample_rates = [1, *config.upsample_rates[::-1][:-1]]
    cumulative = [int(u) for u in np.cumprod(downsample_rates)[::-1]]
    cin = config.istft_n_fft + 2
    layers = []
    for i, rate in enumerate(cumulative):
        cout = config.base_channels // 2 ** (i + 1)
        layers.append(pointwise(cin, cout) if rate == 1 else strided(cin, cout, rate))
    return nn.ModuleList(layers)


def _pointwise(cin: int, cout: int) -> nn.Module:
    return nn.Conv1d(cin, cout, 1, 1)


def _strided(cin: int, cout: int, rate: int) -> nn.Module:
    return nn.Conv1d(cin, cout, rate * 2, rate, padding=rate // 2)


def strip_upstream_prefix(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """hift.pt keys as upstream loads them: every `generator.` removed (upstream uses
    str.replace, not a prefix strip, and so do we)."""
    return {key.replace(UPSTREAM_PREFIX, ""): value for key, value in state_dict.items()}


def fuse_weight_norm(module: nn.Module) -> None:
    """Bake weight-norm parametrizations into plain weights for inference. The fused weight is
    the very tensor the parametrization computes on every call, so outputs are unchanged; state
    dict keys change, so load weights before fusing."""
    for submodule in module.modules():
        if parametrize.is_parametrized(submodule, "weight"):
            parametrize.remove_parametrizations(submodule, "weight", leave_parametrized=True)


# ---------------------------------------------------------------------------------------------
# Streaming, scheme A (upstream Token2wav.stream / vllm-omni BatchedToken2Wav)


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


def fade_window(overlap: int, device: torch.device | str = "cpu") -> Tensor:
    """np.hamming(2 * overlap) in float64, as upstream builds `speech_window` (7680 samples),
    with the portable cos under portable kernels (numpy: 0.54 + 0.46 cos(pi n / (M - 1)))."""
    size = 2 * overlap
    if size < 2 or not portable_active():
        return torch.from_numpy(np.hamming(size)).to(device)
    n = np.arange(1 - size, size, 2)
    return torch.from_numpy(0.54 + 0.46 * _cos(np.pi * n / (size - 1))).to(device)


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
    (80, F_b). Each row within rounding of its solo step (vocoder.hift_ragged)."""
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


# ---------------------------------------------------------------------------------------------
# Construction without the global RNG


def build_hift(config: HiftConfig, device: torch.device | str = "cpu") -> HiFTGenerator:
    """A HiFTGenerator whose weights are to be replaced (load a state dict or call
    `initialise_hift`). Module construction draws its default init from the global RNG; the
    RNG state is restored afterwards, so building a vocoder never shifts anyone's random stream.
    (Building on the meta device would avoid the draws but costs seconds in torch's device
    context on first use.)"""
    with torch.random.fork_rng(devices=[]):
        model = HiFTGenerator(config)
    return model.to(device).eval()


FIXTURE_GAIN = 1.5  # U(+-gain/sqrt(fan_in)): keeps the mel path alive through three stages
FIXTURE_POST_GAIN = 0.7  # conv_post: log-magnitudes of order 1, so exp() neither vanishes nor clips
FIXTURE_F0_HZ = 150.0  # F0 head bias: most frames voiced (> 10 Hz), the harmonic source runs
FIXTURE_F0_GAIN = 60.0  # F0 head weights: F0 moves with the mel (about 120-170 Hz)


def initialise_hift(model: nn.Module, seed: int) -> None:
    """Random weights from one seeded generator, for fixtures (real weights come from hift.pt).

    Not upstream's training init (N(0, 0.01) for the upsampling, resblock and output convs):
    with it the mel's contribution shrinks ~100x per stage and the audio of an untrained model
    is the source noise alone, so a golden hash would not notice a broken flow. Instead every
    layer draws U(+-FIXTURE_GAIN/sqrt(fan_in)) (conv_post FIXTURE_POST_GAIN), the F0 head is set
    so that most frames are voiced, weight-norm gains equal the norm of their direction (the
    effective weight is the drawn one) and Snake alphas are 1. `model`: a HiFTGenerator or a
    CausalHiFTGenerator (the same parameter names).
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, module in model.named_modules():
            _initialise_module(name, module, generator)
        head = model.get_submodule("f0_predictor.classifier")
        assert isinstance(head, nn.Linear)
        bound = FIXTURE_F0_GAIN / math.sqrt(head.weight.shape[1])
        head.weight.uniform_(-bound, bound, generator=generator)
        head.bias.fill_(FIXTURE_F0_HZ)


def _weight_parts(module: nn.Module) -> tuple[Tensor | None, Tensor]:
    """(weight-norm gain or None, the drawn weight tensor) of a layer."""
    if parametrize.is_parametrized(module, "weight"):
        parametrizations = module.parametrizations
        assert isinstance(parametrizations, nn.ModuleDict)
        weight = parametrizations["weight"]
        gain, direction = weight.original0, weight.original1
        assert isinstance(gain, Tensor) and isinstance(direction, Tensor)
        return gain, direction
    assert isinstance(module.weight, Tensor)
    return None, module.weight


def _initialise_module(name: str, module: nn.Module, generator: torch.Generator) -> None:
    if isinstance(module, Snake):
        module.alpha.fill_(1.0)
        return
    if not isinstance(module, nn.Conv1d | nn.ConvTranspose1d | nn.Linear):
        return
    gain, direction = _weight_parts(module)
    scale = FIXTURE_POST_GAIN if name == "conv_post" else FIXTURE_GAIN
    bound = scale / math.sqrt(direction[0].numel())
    direction.uniform_(-bound, bound, generator=generator)
    if gain is not None:
        dims = tuple(range(1, direction.dim()))
        gain.copy_(torch.linalg.vector_norm(direction, dim=dims, keepdim=True))
    if module.bias is not None:
        module.bias.uniform_(-bound, bound, generator=generator)
