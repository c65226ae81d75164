"""HiFT parity with the upstream `HiFTGenerator` (stepaudio2-minicpmo 0.1.1) on identical weights.

The upstream package (and scipy, which it imports) is a test dependency; see
tests/vocoder/reference.py for when its absence skips (a developer box) and when it fails (CI,
or any import error other than "not installed").

Weights (`parity_weights`): the fixture init with the F0 head biased into the voiced range (each
test asserts at least VOICED_SHARE of its frames are voiced, so the sine source, its phase
integration, the harmonics and the voiced noise level are all compared), random conv biases,
weight-norm gains and Snake alphas; several seeds, batch > 1. Comparison is bit-exact.

Noise: upstream draws the harmonic phases and the source noise from the global RNG on every
call (`torch.rand(B, 9)`, then `randn_like` on a transposed (B, samples, 9) view, which fills
memory in (B, 9, samples) order through torch's serial normal path). Ours cannot draw them
itself: by design it takes them as an input (one seeded generator per row, so a request never
depends on its batch mates). So the test seeds the global RNG identically, rebuilds exactly those
draws for our side, and checks the rebuild against what upstream really drew (`_Draws` records
upstream's `torch.rand` / `torch.randn_like` results) rather than copying upstream's tensors.

Mutations checked to fail these tests (each applied to a scratch copy of vocoder/hift/, the
tests rerun there): sine phase `* 2 * np.pi` -> `* np.pi` and voiced noise x10 (forward and
streaming tests; both passed with the former `randn * 0.1` weights, whose F0 was 0.03-0.07 Hz on
every frame); Hann for Hamming in the cross-fade (streaming test).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from codeclog.vocoder.hift.config import HiftConfig
from codeclog.vocoder.hift.excitation import SourceNoise
from codeclog.vocoder.hift.fixture_weights import initialise_hift
from codeclog.vocoder.hift.noncausal import HiFTGenerator, build_hift, strip_upstream_prefix
from codeclog.vocoder.hift.noncausal_stream import HiftCache, stream_step
from tests.vocoder.hift_helpers import randomise_gains
from tests.vocoder.reference import import_reference

pytestmark = pytest.mark.vocoder
CACHE = 3840
SEEDS = (1, 2, 3)
VOICED_SHARE = 0.9  # at least this share of frames must be voiced (F0 > 10 Hz)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # what the engine uses (vocoder.determinism): two OpenMP threads on a shared 2-core box
    # spin against other work and run many times slower
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def upstream() -> Any:
    """stepaudio2.flashcosyvoice.modules.hifigan (tests/vocoder/reference.py: skip or fail)."""
    return import_reference("flashcosyvoice.modules.hifigan")[0]


def _upstream_hift(module: Any, config: HiftConfig) -> nn.Module:
    f0 = module.ConvRNNF0Predictor(in_channels=config.in_channels, cond_channels=config.f0_channels)
    with torch.random.fork_rng(devices=[]):  # upstream initialises from the global RNG
        model = module.HiFTGenerator(base_channels=config.base_channels, f0_predictor=f0)
    return model.eval()


def parity_weights(model: HiFTGenerator, seed: int) -> None:
    """The fixture init (`initialise_hift`: mel path alive, F0 head biased to about 150 Hz so
    most frames are voiced and the harmonic source runs), then random weight-norm gains
    (x U(0.8, 1.25), so the norm's gain and direction both matter) and Snake alphas U(0.5, 2).
    The former `randn * 0.1` weights put F0 at 0.03-0.07 Hz on every frame: the sine source was
    multiplied by 0 and its phase, harmonics and voiced noise were never compared."""
    initialise_hift(model, seed)
    randomise_gains(model, seed)


def _pair(module: Any, config: HiftConfig, seed: int) -> tuple[nn.Module, HiFTGenerator]:
    ours = build_hift(config)
    parity_weights(ours, seed)
    reference = _upstream_hift(module, config)
    reference.load_state_dict(ours.state_dict(), strict=True)
    return reference, ours


def _upstream_noise(batch: int, samples: int, harmonics: int) -> SourceNoise:
    """Exactly the global-RNG draws upstream's SineGen2 makes, in its order and layout."""
    phase = torch.rand(batch, harmonics)
    gaussian = torch.empty(batch, harmonics, samples).transpose(1, 2).normal_()
    return SourceNoise(phase, gaussian)


class _Draws:
    """Records what upstream drew: `torch.rand` (start phases) and `torch.randn_like` (the
    sine noise, then the unused noise branch), so the rebuilt draws are compared with them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rand: list[Tensor] = []
        self.randn_like: list[Tensor] = []
        rand, randn_like = torch.rand, torch.randn_like

        def record_rand(*args: Any, **kwargs: Any) -> Tensor:
            out = rand(*args, **kwargs)
            self.rand.append(out.clone())
            return out

        def record_randn_like(*args: Any, **kwargs: Any) -> Tensor:
            out = randn_like(*args, **kwargs)
            self.randn_like.append(out.clone())
            return out

        self._patches = [("rand", record_rand), ("randn_like", record_randn_like)]
        self._monkeypatch = monkeypatch

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        with self._monkeypatch.context() as patch:
            for name, fn in self._patches:
                patch.setattr(torch, name, fn)
            yield

    def check(self, rebuilt: Sequence[SourceNoise]) -> None:
        """Upstream drew, per call, the phases then the sine noise that the rebuild holds."""
        assert len(self.rand) == len(rebuilt), "one phase draw per upstream call"
        for index, noise in enumerate(rebuilt):
            assert torch.equal(self.rand[index], noise.phase), f"phases of call {index}"
            # per call: the sine noise, then the dropped noise branch (randn_like(uv))
            assert torch.equal(self.randn_like[2 * index], noise.gaussian), f"noise {index}"


def _voiced_share(model: HiFTGenerator, mel: Tensor) -> float:
    with torch.inference_mode():
        f0 = model.f0_predictor(mel)
    return float((f0 > model.config.nsf_voiced_threshold_hz).float().mean())


@pytest.fixture(scope="module")
def full_pair(upstream: Any) -> tuple[nn.Module, HiFTGenerator]:
    """The published sizes (upstream's defaults): built once, it takes seconds."""
    return _pair(upstream, HiftConfig.full(), seed=1)


def _forward_cases() -> list[Any]:
    tiny = [pytest.param("tiny", 20, seed, id=f"tiny-seed{seed}") for seed in SEEDS]
    return [*tiny, pytest.param("published sizes", 4, 1, id="published-sizes")]


@pytest.mark.parametrize(("name", "frames", "seed"), _forward_cases())
def test_forward_is_bit_identical_to_upstream(
    name: str,
    frames: int,
    seed: int,
    upstream: Any,
    full_pair: tuple[nn.Module, HiFTGenerator],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batch 3, mostly voiced frames, upstream's own noise draws (recorded and compared).

    Mutations checked to fail here (each applied to a scratch copy of vocoder/hift/): sine
    phase `* 2 * np.pi` -> `* np.pi` (SineGen2._f02sine); voiced noise x10 (`uv * noise_std`
    -> `uv * noise_std * 10`). Both passed with the former `randn * 0.1` weights.
    """
    if name == "published sizes":
        reference, ours = full_pair
    else:
        reference, ours = _pair(upstream, HiftConfig.tiny(), seed)
    config = ours.config
    generator = torch.Generator().manual_seed(100 + seed)
    mel = torch.randn(3, 80, frames, generator=generator) - 5.0
    cache = 0.1 * torch.randn(3, 1, min(CACHE, frames * 480 // 2), generator=generator)
    assert _voiced_share(ours, mel) >= VOICED_SHARE
    draws = _Draws(monkeypatch)
    with torch.inference_mode():
        torch.manual_seed(7 + seed)
        with draws.recording():
            expected_speech, expected_source = reference(mel, cache)
        torch.manual_seed(7 + seed)
        noise = _upstream_noise(3, frames * 480, config.nb_harmonics + 1)
        speech, source = ours(mel, cache, noise)
    draws.check([noise])
    assert torch.equal(speech, expected_speech), name
    assert torch.equal(source, expected_source), name


def test_published_layout_loads_with_generator_prefix_and_legacy_weight_norm_keys(
    full_pair: tuple[nn.Module, HiFTGenerator],
) -> None:
    """hift.pt as saved by the training wrapper: `generator.` prefix, old weight_g/weight_v."""
    reference = full_pair[0]
    legacy = {
        "generator."
        + key.replace("parametrizations.weight.original0", "weight_g").replace(
            "parametrizations.weight.original1", "weight_v"
        ): value
        for key, value in reference.state_dict().items()
    }
    ours = build_hift(HiftConfig.full())
    ours.load_state_dict(strip_upstream_prefix(legacy), strict=True)
    loaded = ours.state_dict()
    for key, value in reference.state_dict().items():
        assert torch.equal(loaded[key], value), key


class _GlobalRngHift(nn.Module):
    """Our HiFT fed with upstream's global-RNG draws (seeded per call by the test)."""

    def __init__(self, inner: HiFTGenerator, seeds: Sequence[int]) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.seeds = list(seeds)
        self.noise: list[SourceNoise] = []

    def forward(
        self, mel: Tensor, cache_source: Tensor, noise: SourceNoise
    ) -> tuple[Tensor, Tensor]:
        del noise  # replaced by upstream's draws
        torch.manual_seed(self.seeds.pop(0))
        samples = mel.shape[2] * self.config.samples_per_frame
        upstream_noise = _upstream_noise(mel.shape[0], samples, self.config.nb_harmonics + 1)
        self.noise.append(upstream_noise)
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
    """The vocoder half of upstream `Token2wav.stream` (0.1.1), window by window, for B rows
    at once (upstream's loop runs B = 1; its HiFT call and cache slicing are batch-agnostic)."""
    window = torch.from_numpy(np.hamming(2 * CACHE))
    rows = mels[0].shape[0]
    cache = {
        "mel": torch.zeros(rows, 80, 0),
        "source": torch.zeros(rows, 1, 0),
        "speech": torch.zeros(rows, 0),
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


@pytest.mark.parametrize("seed", SEEDS)
def test_streaming_windows_are_bit_identical_to_upstream_loop(
    seed: int, upstream: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 2; first window, later ones and the final one: caches, float64 Hamming fade,
    hold-back; mostly voiced, so the cached excitation carries the harmonic source over.

    Mutations checked to fail here (scratch copy of vocoder/hift/): Hann for Hamming in the
    cross-fade (`fade_window`: np.hamming -> np.hanning); sine phase 2*pi -> pi; voiced noise
    x10.
    """
    config = HiftConfig.tiny()
    reference, ours = _pair(upstream, config, seed)
    generator = torch.Generator().manual_seed(200 + seed)
    mels = [torch.randn(2, 80, frames, generator=generator) - 5.0 for frames in (50, 50, 26)]
    assert _voiced_share(ours, torch.cat(mels, dim=2)) >= VOICED_SHARE
    seeds = [10 * seed + k for k in (1, 2, 3)]
    draws = _Draws(monkeypatch)
    with torch.inference_mode():
        with draws.recording():
            expected = _upstream_stream(reference, mels, seeds)
        wrapped = _GlobalRngHift(ours, seeds)
        caches = [HiftCache.empty(config)] * 2
        for index, mel in enumerate(mels):
            step = stream_step(wrapped, caches, mel, index == len(mels) - 1, [0, 0])  # type: ignore[arg-type]
            caches = step.caches
            for row in range(2):
                assert torch.equal(step.audio[row], expected[index][row]), (index, row)
    draws.check(wrapped.noise)


def test_seeded_initialisation_is_reproducible_and_leaves_the_global_rng_alone() -> None:
    before = torch.random.get_rng_state()
    first, second = build_hift(HiftConfig.tiny()), build_hift(HiftConfig.tiny())
    initialise_hift(first, 5)
    initialise_hift(second, 5)
    assert torch.equal(before, torch.random.get_rng_state())
    expected = second.state_dict()
    for key, value in first.state_dict().items():
        assert torch.equal(value, expected[key]), key
