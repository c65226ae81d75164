"""`HiFTGenerator` (NSF + iSTFTNet), scheme A's generator: upstream's module tree, its randomness
an input and its sizes a `HiftConfig` (docs/vocoder.md, "HiFT, scheme A")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from codeclog.vocoder.hift.config import HiftConfig
from codeclog.vocoder.hift.excitation import SourceModuleHnNSF2, SourceNoise
from codeclog.vocoder.hift.layers import Snake, filter_stages, resblock_stacks, source_downs
from codeclog.vocoder.hift.rows import HiftRows, masked_convs, reflect_ends, solo_envelope
from codeclog.vocoder.hift.window_functions import hann_periodic
from codeclog.vocoder.kernels import portable_active

UPSTREAM_PREFIX = "generator."  # hift.pt keys carry it when saved from the training wrapper


def _padding(kernel_size: int, dilation: int = 1) -> int:
    return (kernel_size * dilation - dilation) // 2


def _wn_conv(cin: int, cout: int, kernel: int, dilation: int = 1, padding: int = 0) -> nn.Module:
    conv = nn.Conv1d(cin, cout, kernel, 1, dilation=dilation, padding=padding)
    return weight_norm(conv)


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
        self.stft_window = hann_periodic(config.istft_n_fft)
        self._portable_window: Tensor | None = None

    def window(self, device: torch.device) -> Tensor:
        """The STFT window; under portable kernels the portably computed one."""
        if not portable_active():
            return self.stft_window.to(device)
        if self._portable_window is None:
            self._portable_window = hann_periodic(self.config.istft_n_fft)
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
        With `rows` a ragged call (vocoder.hift.rows): mel right-padded, row b's cache its
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


def _up_layers(config: HiftConfig) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for i, (rate, kernel) in enumerate(
        zip(config.upsample_rates, config.upsample_kernel_sizes, strict=True)
    ):
        cin, cout = config.base_channels // 2**i, config.base_channels // 2 ** (i + 1)
        conv = nn.ConvTranspose1d(cin, cout, kernel, rate, padding=(kernel - rate) // 2)
        layers.append(weight_norm(conv))
    return layers


def _pointwise(cin: int, cout: int) -> nn.Module:
    return nn.Conv1d(cin, cout, 1, 1)


def _strided(cin: int, cout: int, rate: int) -> nn.Module:
    return nn.Conv1d(cin, cout, rate * 2, rate, padding=rate // 2)


def strip_upstream_prefix(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """hift.pt keys as upstream loads them: every `generator.` removed (upstream uses
    str.replace, not a prefix strip, and so do we)."""
    return {key.replace(UPSTREAM_PREFIX, ""): value for key, value in state_dict.items()}


def build_hift(config: HiftConfig, device: torch.device | str = "cpu") -> HiFTGenerator:
    """A HiFTGenerator whose weights are to be replaced (load a state dict or call
    `initialise_hift`). Module construction draws its default init from the global RNG; the
    RNG state is restored afterwards, so building a vocoder never shifts anyone's random stream.
    (Building on the meta device would avoid the draws but costs seconds in torch's device
    context on first use.)"""
    with torch.random.fork_rng(devices=[]):
        model = HiFTGenerator(config)
    return model.to(device).eval()
