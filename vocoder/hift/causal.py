"""`CausalHiFTGenerator`, scheme B's generator: CosyVoice3's causal HiFT as minicpmo-utils
1.0.7 ships it, its layers padded on one side only (docs/vocoder.md, "Scheme B")."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from codeclog.vocoder.errors import VocoderConfigError, VocoderInputError
from codeclog.vocoder.hift.config import HiftConfig
from codeclog.vocoder.hift.fixture_weights import initialise_hift
from codeclog.vocoder.hift.layers import Snake, filter_stages, resblock_stacks, source_downs
from codeclog.vocoder.hift.window_functions import hann_periodic
from codeclog.vocoder.kernels import portable_active

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11 on

UPSTREAM_NOISE_TABLE_SAMPLES = 300 * 24000  # SineGen2.sine_waves: 300 s of (samples, 9) U[0, 1)


@dataclasses.dataclass(frozen=True)
class CausalHiftConfig(HiftConfig):
    """Sizes of the causal HiFT (defaults: the published CosyVoice3 / minicpmo-utils 1.0.7
    `config.yaml`, the generator's the same as scheme A's) and of its streaming rule: the
    generator's fields are HiftConfig's (the F0 predictor's f0_layers convs: one k=4 looking 3
    frames right, then k=3 left-causal ones); scheme A's mel_cache_frames is not used here
    (scheme B's delay follows from the model's contexts, `context_limits`)."""

    KIND: ClassVar[str] = "causal HiFT"

    conv_pre_look_right: int = 4
    block_frames: int = 16  # internal streaming block (BoundedVocoder's default)
    noise_table_samples: int = UPSTREAM_NOISE_TABLE_SAMPLES  # wraps around after this many
    noise_seed: int = 0  # the noise table's generator seed (upstream: the global RNG at init)

    def __post_init__(self) -> None:
        super().__post_init__()
        if min(self.block_frames, self.conv_pre_look_right, self.noise_table_samples) < 1:
            raise VocoderConfigError("block_frames, conv_pre_look_right, noise table must be >= 1")
        if self.samples_per_frame != 480 or self.sampling_rate_hz != 24000:
            raise VocoderConfigError("the causal HiFT runs at 24 kHz, 480 samples per mel frame")

    @classmethod
    def tiny(cls) -> Self:
        """Same interface, fast on 2 CPU cores; a 4 s noise table, so tests wrap around it."""
        return dataclasses.replace(super().tiny(), noise_table_samples=4 * 24000)


class CausalConv1d(nn.Conv1d):
    """A stride-1 conv padded on one side by `causal_padding` frames: zeros, or the given
    `context` (the right look-ahead of a streaming call)."""

    def __init__(
        self, cin: int, cout: int, kernel: int, dilation: int = 1, causal_type: str = "left"
    ) -> None:
        super().__init__(cin, cout, kernel, 1, padding=0, dilation=dilation)
        self.causal_padding = (kernel * dilation - dilation) // 2 * 2 + (kernel + 1) % 2
        if causal_type not in ("left", "right"):
            raise VocoderConfigError(f"causal_type must be left or right, got {causal_type!r}")
        self.causal_type = causal_type

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        if context is None:
            context = x.new_zeros(x.shape[0], x.shape[1], self.causal_padding)
        if context.shape[2] != self.causal_padding:
            raise VocoderInputError(f"context must hold {self.causal_padding} frames")
        padded = torch.cat([context, x] if self.causal_type == "left" else [x, context], dim=2)
        return super().forward(padded)


class CausalConv1dDownSample(nn.Conv1d):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__(cin, cout, kernel, stride, padding=0)
        if stride == 1 or kernel % stride:
            raise VocoderConfigError("a causal downsampling conv needs stride > 1 dividing kernel")
        self.causal_padding = stride - 1

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(F.pad(x, (self.causal_padding, 0), value=0.0))


class CausalConv1dUpsample(nn.Conv1d):
    """Nearest upsampling by `stride`, then a left-padded stride-1 conv (upstream's replacement
    for the transposed conv; its weight is (out, in, k), not a ConvTranspose1d's)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__(cin, cout, kernel, 1, padding=0)
        self.causal_padding = kernel - 1
        self.upsample = nn.Upsample(scale_factor=stride, mode="nearest")

    def forward(self, x: Tensor) -> Tensor:
        x = F.pad(self.upsample(x), (self.causal_padding, 0), value=0.0)
        return super().forward(x)


class CausalResBlock(nn.Module):
    """ResBlock(causal=True): dilated left-causal convs with Snake activations."""

    def __init__(self, channels: int, kernel: int, dilations: Sequence[int]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            weight_norm(CausalConv1d(channels, channels, kernel, d)) for d in dilations
        )
        self.convs2 = nn.ModuleList(
            weight_norm(CausalConv1d(channels, channels, kernel)) for _ in dilations
        )
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def history(self) -> int:
        """Frames of left context the block reads (upstream `_residual_history`)."""
        return sum(causal_padding_of(conv) for conv in (*self.convs1, *self.convs2))

    def forward(self, x: Tensor) -> Tensor:
        for conv1, conv2, act1, act2 in zip(
            self.convs1, self.convs2, self.activations1, self.activations2, strict=True
        ):
            x = conv2(act2(conv1(act1(x)))) + x
        return x


def causal_padding_of(module: nn.Module) -> int:
    padding = getattr(module, "causal_padding", None)
    if not isinstance(padding, int):
        raise VocoderConfigError(f"{type(module).__name__} is not a causal conv")
    return padding


class CausalConvRNNF0Predictor(nn.Module):
    """Mel -> F0 (Hz): conv k=4 looking 3 frames right, layers - 1 (upstream: 4) left-causal
    k=3 convs, ELU, linear."""

    def __init__(self, in_channels: int, channels: int, layers: int) -> None:
        super().__init__()
        stack: list[nn.Module] = [
            weight_norm(CausalConv1d(in_channels, channels, 4, causal_type="right")),
            nn.ELU(),
        ]
        for _ in range(layers - 1):
            stack += [weight_norm(CausalConv1d(channels, channels, 3)), nn.ELU()]
        self.condnet = nn.Sequential(*stack)
        self.classifier = nn.Linear(channels, 1)

    @property
    def right_context(self) -> int:
        return causal_padding_of(self.condnet[0])

    @property
    def left_context(self) -> int:
        return sum(
            causal_padding_of(m) for m in list(self.condnet)[1:] if isinstance(m, CausalConv1d)
        )

    def forward(self, x: Tensor, finalize: bool = True) -> Tensor:
        first = self.condnet[0]
        if finalize:
            x = first(x)
        else:
            right = self.right_context
            x = first(x[:, :, :-right], x[:, :, -right:])
        for layer in list(self.condnet)[1:]:
            x = layer(x)
        return torch.abs(self.classifier(x.transpose(1, 2)).squeeze(-1))


class CausalSourceModule(nn.Module):
    """The harmonic source's learned part (upstream `SourceModuleHnNSF`: `l_linear` + tanh);
    the sines and the noise are made by `CausalVocoder` from float64 phases and the table."""

    def __init__(self, config: CausalHiftConfig) -> None:
        super().__init__()
        self.l_linear = nn.Linear(config.nb_harmonics + 1, 1)
        self.l_tanh = nn.Tanh()

    def forward(self, excitation: Tensor) -> Tensor:
        return self.l_tanh(self.l_linear(excitation))


class CausalHiFTGenerator(nn.Module):
    """CosyVoice3 causal HiFT: upstream parameter names and shapes (strict `hift.pt` load)."""

    def __init__(self, config: CausalHiftConfig) -> None:
        super().__init__()
        self.config = config
        rates = config.upsample_rates
        self.m_source = CausalSourceModule(config)
        self.conv_pre = weight_norm(
            CausalConv1d(
                config.in_channels,
                config.base_channels,
                config.conv_pre_look_right + 1,
                causal_type="right",
            )
        )
        self.ups = nn.ModuleList(
            weight_norm(
                CausalConv1dUpsample(
                    config.base_channels // 2**i, config.base_channels // 2 ** (i + 1), k, u
                )
            )
            for i, (u, k) in enumerate(zip(rates, config.upsample_kernel_sizes, strict=True))
        )
        self.source_downs = source_downs(config, _pointwise, _strided)
        self.source_resblocks, self.resblocks = resblock_stacks(config, CausalResBlock)
        last = config.base_channels // 2 ** len(rates)
        self.conv_post = weight_norm(CausalConv1d(last, config.istft_n_fft + 2, 7))
        self.reflection_pad = nn.ReflectionPad1d((1, 0))
        self.f0_predictor = CausalConvRNNF0Predictor(
            config.in_channels, config.f0_channels, config.f0_layers
        )
        self.stft_window = hann_periodic(config.istft_n_fft)  # not in the state dict

    def _window(self, device: torch.device) -> Tensor:
        window = hann_periodic(self.config.istft_n_fft) if portable_active() else self.stft_window
        return window.to(device)

    def decode(self, mel: Tensor, source: Tensor, finalize: bool = True) -> Tensor:
        """mel (B, 80, T), excitation (B, 1, T*480) -> speech (B, T*480), or (B, (T-5)*480)
        for a non-final call (the last 4 frames are conv_pre's look-ahead, one iSTFT frame
        waits for the next call)."""
        config = self.config
        n_fft, hop = config.istft_n_fft, config.istft_hop
        window = self._window(source.device)
        spec = torch.view_as_real(
            torch.stft(source.squeeze(1), n_fft, hop, n_fft, window, return_complex=True)
        )
        real, imag = spec[..., 0], spec[..., 1]
        look = config.conv_pre_look_right
        if finalize:
            x = self.conv_pre(mel)
        else:
            x = self.conv_pre(mel[:, :, :-look], mel[:, :, -look:])
            drop = math.prod(config.upsample_rates) * look
            real, imag = real[:, :, :-drop], imag[:, :, :-drop]
        s_stft = torch.cat([real, imag], dim=1)
        x = filter_stages(self, x, s_stft, config)
        bins = n_fft // 2 + 1
        magnitude = torch.clip(torch.exp(x[:, :bins, :]), max=1e2)
        phase = torch.sin(x[:, bins:, :])
        spec_out = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        speech = torch.istft(spec_out, n_fft, hop, n_fft, window=window)
        if not finalize:
            speech = speech[:, : -config.samples_per_frame]
        return torch.clamp(speech, -config.audio_limit, config.audio_limit)


def _pointwise(cin: int, cout: int) -> nn.Module:
    return CausalConv1d(cin, cout, 1)


def _strided(cin: int, cout: int, rate: int) -> nn.Module:
    return CausalConv1dDownSample(cin, cout, rate * 2, rate)


def build_causal_hift(config: CausalHiftConfig) -> CausalHiFTGenerator:
    """Weights to be loaded or initialised; the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        model = CausalHiFTGenerator(config)
    return model.eval()


def initialise_causal_hift(model: CausalHiFTGenerator, seed: int) -> None:
    """Seeded random weights for fixtures, tests and benchmarks (real ones come from hift.pt):
    the scheme-A fixture rule (`vocoder.hift.fixture_weights.initialise_hift`: every layer
    U(+-gain/sqrt(fan_in)), weight-norm gains equal to their direction's norm, Snake alphas 1)
    and the F0 head biased to about 150 Hz, so most frames are voiced and the harmonic source
    runs."""
    initialise_hift(model, seed)
