"""`HiftConfig`: every size of the HiFT generator and of its scheme-A streaming rule, checked
when built, and its JSON form (docs/vocoder.md, "HiFT, scheme A")."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from codeclog.vocoder.errors import VocoderConfigError

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11 on


@dataclasses.dataclass(frozen=True)
class HiftConfig:
    """Every size of the HiFT generator and of its streaming rule. Defaults are the published
    sizes (`hift.pt` of Step-Audio2 / MiniCPM-o 4.5 `assets/token2wav`). The causal HiFT's
    config extends it (vocoder.hift.causal.CausalHiftConfig)."""

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
