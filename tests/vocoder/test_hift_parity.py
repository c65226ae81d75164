"""HiFT parity with the upstream `HiFTGenerator` (stepaudio2-minicpmo 0.1.1) on identical weights.

Skipped unless the upstream package and scipy are importable (`pip install --no-deps
stepaudio2-minicpmo==0.1.1 scipy`). The upstream package `__init__` imports Token2wav and with
it torchaudio, s3tokenizer and ONNX; so the submodule is imported under a bare package object.

Noise: upstream draws the harmonic phases and the source noise from the global RNG on every
call (`torch.rand(B, 9)`, then `randn_like` on a transposed (B, samples, 9) view, which fills
memory in (B, 9, samples) order through torch's serial normal path). Ours takes them as an
input; for parity the test seeds the global RNG identically and rebuilds exactly those draws.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from vocoder.hift import (
    HiftCache,
    HiftConfig,
    HiFTGenerator,
    SourceNoise,
    build_hift,
    initialise_hift,
    stream_step,
    strip_upstream_prefix,
)

pytestmark = pytest.mark.vocoder
CACHE = 3840


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # what the engine uses (vocoder.determinism): two OpenMP threads on a shared 2-core box
    # spin against other work and run many times slower
    torch.set_num_threads(1)


def _import_upstream() -> types.ModuleType | None:
    spec = importlib.util.find_spec("stepaudio2")
    if spec is None or spec.submodule_search_locations is None:
        return None
    if not hasattr(sys.modules.get("stepaudio2"), "__path__"):
        # a bare package (with its real spec, so later find_spec calls still work) instead of
        # running the package __init__; shared with the flow's parity test
        package = types.ModuleType("stepaudio2")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["stepaudio2"] = package
    try:
        return importlib.import_module("stepaudio2.flashcosyvoice.modules.hifigan")
    except ImportError:
        return None


UPSTREAM = _import_upstream()
needs_upstream = pytest.mark.skipif(
    UPSTREAM is None, reason="stepaudio2-minicpmo 0.1.1 (+ scipy) not installed"
)


def _upstream_hift(config: HiftConfig) -> nn.Module:
    assert UPSTREAM is not None
    f0 = UPSTREAM.ConvRNNF0Predictor(
        in_channels=config.in_channels, cond_channels=config.f0_channels
    )
    model = UPSTREAM.HiFTGenerator(base_channels=config.base_channels, f0_predictor=f0)
    return model.eval()


def _random_weights(model: nn.Module, seed: int) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        key: torch.randn(value.shape, generator=generator) * 0.1
        for key, value in model.state_dict().items()
    }


def _upstream_noise(batch: int, samples: int, harmonics: int) -> SourceNoise:
    """Exactly the global-RNG draws upstream's SineGen2 makes, in its order and layout."""
    phase = torch.rand(batch, harmonics)
    gaussian = torch.empty(batch, harmonics, samples).transpose(1, 2).normal_()
    return SourceNoise(phase, gaussian)


def _pair(config: HiftConfig, seed: int) -> tuple[nn.Module, HiFTGenerator]:
    upstream = _upstream_hift(config)
    weights = _random_weights(upstream, seed)
    upstream.load_state_dict(weights, strict=True)
    ours = build_hift(config)
    ours.load_state_dict(weights, strict=True)
    return upstream, ours


@pytest.fixture(scope="module")
def full_pair() -> tuple[nn.Module, HiFTGenerator]:
    """The published sizes (upstream's defaults): built once, it takes seconds."""
    return _pair(HiftConfig.full(), seed=1)


@needs_upstream
@pytest.mark.parametrize(("name", "frames"), [("tiny", 20), ("published sizes", 4)])
def test_forward_is_bit_identical_to_upstream(
    name: str, frames: int, full_pair: tuple[nn.Module, HiFTGenerator]
) -> None:
    upstream, ours = full_pair if name == "published sizes" else _pair(HiftConfig.tiny(), 1)
    config = ours.config
    mel = torch.randn(2, 80, frames, generator=torch.Generator().manual_seed(2)) - 5.0
    cache = 0.1 * torch.randn(2, 1, min(CACHE, frames * 480 // 2))
    with torch.inference_mode():
        torch.manual_seed(7)
        expected_speech, expected_source = upstream(mel, cache)
        torch.manual_seed(7)
        noise = _upstream_noise(2, frames * 480, config.nb_harmonics + 1)
        speech, source = ours(mel, cache, noise)
    assert torch.equal(speech, expected_speech), name
    assert torch.equal(source, expected_source), name


@needs_upstream
def test_published_layout_loads_with_generator_prefix_and_legacy_weight_norm_keys(
    full_pair: tuple[nn.Module, HiFTGenerator],
) -> None:
    """hift.pt as saved by the training wrapper: `generator.` prefix, old weight_g/weight_v."""
    upstream = full_pair[0]
    legacy = {
        "generator."
        + key.replace("parametrizations.weight.original0", "weight_g").replace(
            "parametrizations.weight.original1", "weight_v"
        ): value
        for key, value in upstream.state_dict().items()
    }
    ours = build_hift(HiftConfig.full())
    ours.load_state_dict(strip_upstream_prefix(legacy), strict=True)
    loaded = ours.state_dict()
    for key, value in upstream.state_dict().items():
        assert torch.equal(loaded[key], value), key


class _GlobalRngHift(nn.Module):
    """Our HiFT fed with upstream's global-RNG draws (seeded per call by the test)."""

    def __init__(self, inner: HiFTGenerator, seeds: Sequence[int]) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.seeds = list(seeds)

    def forward(
        self, mel: Tensor, cache_source: Tensor, noise: SourceNoise
    ) -> tuple[Tensor, Tensor]:
        del noise  # replaced by upstream's draws
        torch.manual_seed(self.seeds.pop(0))
        samples = mel.shape[2] * self.config.samples_per_frame
        upstream_noise = _upstream_noise(mel.shape[0], samples, self.config.nb_harmonics + 1)
        return self.inner(mel, cache_source, upstream_noise)


def _fade_in_out(fade_in: Tensor, fade_out: Tensor, window: Tensor) -> Tensor:
    """Copied from stepaudio2/token2wav.py (0.1.1) `fade_in_out`."""
    overlap = int(window.shape[0] / 2)
    fade_in = fade_in.clone()
    fade_in[..., :overlap] = (
        fade_in[..., :overlap] * window[:overlap] + fade_out[..., -overlap:] * window[overlap:]
    )
    return fade_in


def _upstream_stream(
    hift: Callable[..., tuple[Tensor, Tensor]], mels: Sequence[Tensor], seeds: Sequence[int]
) -> list[Tensor]:
    """The vocoder half of upstream `Token2wav.stream` (0.1.1), window by window."""
    window = torch.from_numpy(np.hamming(2 * CACHE))
    cache = {
        "mel": torch.zeros(1, 80, 0),
        "source": torch.zeros(1, 1, 0),
        "speech": torch.zeros(1, 0),
    }
    out: list[Tensor] = []
    for index, (chunk_mel, seed) in enumerate(zip(mels, seeds, strict=True)):
        last_chunk = index == len(mels) - 1
        mel = torch.concat([cache["mel"], chunk_mel], dim=2)
        torch.manual_seed(seed)
        speech, source = hift(mel, cache["source"])
        if cache["speech"].shape[-1] > 0:
            speech = _fade_in_out(speech, cache["speech"], window)
        cache = {
            "mel": mel[..., -8:].clone(),
            "source": source[:, :, -CACHE:].clone(),
            "speech": speech[:, -CACHE:].clone(),
        }
        out.append(speech if last_chunk else speech[:, :-CACHE])
    return out


@needs_upstream
def test_streaming_windows_are_bit_identical_to_upstream_loop() -> None:
    """First window, a later one and the final one: caches, float64 Hamming fade, hold-back."""
    config = HiftConfig.tiny()
    upstream, ours = _pair(config, seed=3)
    generator = torch.Generator().manual_seed(4)
    mels = [torch.randn(1, 80, frames, generator=generator) - 5.0 for frames in (50, 50, 26)]
    seeds = [11, 12, 13]
    with torch.inference_mode():
        expected = _upstream_stream(upstream, mels, seeds)
        wrapped = _GlobalRngHift(ours, seeds)
        caches = [HiftCache.empty(config)]
        for index, mel in enumerate(mels):
            step = stream_step(wrapped, caches, mel, index == len(mels) - 1, [0])  # type: ignore[arg-type]
            caches = step.caches
            assert torch.equal(step.audio[0], expected[index][0]), f"window {index}"


def test_seeded_initialisation_is_reproducible_and_leaves_the_global_rng_alone() -> None:
    before = torch.random.get_rng_state()
    first, second = build_hift(HiftConfig.tiny()), build_hift(HiftConfig.tiny())
    initialise_hift(first, 5)
    initialise_hift(second, 5)
    assert torch.equal(before, torch.random.get_rng_state())
    expected = second.state_dict()
    for key, value in first.state_dict().items():
        assert torch.equal(value, expected[key]), key
