"""HiFT alone: config validation, seeded noise, output lengths and the scheme-A streaming rule."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codeclog.vocoder.errors import VocoderConfigError
from codeclog.vocoder.hift.config import HiftConfig
from codeclog.vocoder.hift.excitation import draw_source_noise
from codeclog.vocoder.hift.fixture_weights import initialise_hift
from codeclog.vocoder.hift.layers import fuse_weight_norm
from codeclog.vocoder.hift.noncausal import HiFTGenerator, build_hift
from codeclog.vocoder.hift.noncausal_stream import HiftCache, cross_fade, stream_step
from codeclog.vocoder.hift.window_functions import fade_window

pytestmark = pytest.mark.vocoder
HOLD = 3840  # samples held back / cross-faded (8 mel frames x 480)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # as the engine does; see vocoder.determinism


@pytest.fixture(scope="module")
def hift() -> HiFTGenerator:
    torch.set_num_threads(1)
    model = build_hift(HiftConfig.tiny())
    initialise_hift(model, 11)
    return model


def _mel(frames: int, seed: int, batch: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 80, frames, generator=generator) * 1.5 - 6.0


@pytest.mark.parametrize(
    ("name", "override"),
    [
        ("kernel count differs from rates", {"upsample_kernel_sizes": (16, 11)}),
        ("source kernels per stage", {"source_resblock_kernel_sizes": (7, 7)}),
        ("source dilations per stage", {"source_resblock_dilations": ((1, 3, 5),)}),
        ("resblock kernels vs dilations", {"resblock_kernel_sizes": (3, 7)}),
        ("channels not halvable per stage", {"base_channels": 12}),
        ("no mel cache", {"mel_cache_frames": 0}),
        ("22.05 kHz source module", {"sampling_rate_hz": 22050}),
    ],
)
def test_config_refuses_contradictions(name: str, override: dict[str, Any]) -> None:
    with pytest.raises(VocoderConfigError):
        dataclasses.replace(HiftConfig.tiny(), **override)


def test_config_dict_round_trip_and_unknown_keys() -> None:
    config = HiftConfig.tiny()
    assert HiftConfig.from_dict(config.to_dict()) == config
    with pytest.raises(VocoderConfigError, match="unknown HiFT config keys: colour"):
        HiftConfig.from_dict({**config.to_dict(), "colour": 1})


def test_published_streaming_constants() -> None:
    config = HiftConfig.full()
    assert (config.samples_per_frame, config.cache_samples) == (480, HOLD)
    window = fade_window(HOLD)
    assert window.dtype == torch.float64 and window.shape == (2 * HOLD,)


def test_noise_rows_depend_only_on_their_seed_and_not_on_the_global_rng() -> None:
    before = torch.random.get_rng_state()
    batch = draw_source_noise([5, 6, 7], 960, 9)
    assert torch.equal(before, torch.random.get_rng_state())
    for row, seed in enumerate([5, 6, 7]):
        alone = draw_source_noise([seed], 960, 9)
        assert torch.equal(batch.phase[row], alone.phase[0])
        assert torch.equal(batch.gaussian[row], alone.gaussian[0])
    assert not torch.equal(batch.gaussian[0], batch.gaussian[1])


@pytest.mark.parametrize("frames", [1, 2, 3, 7, 8, 9, 50, 58, 113, 256])
def test_output_is_480_samples_per_frame(hift: HiFTGenerator, frames: int) -> None:
    with torch.inference_mode():
        noise = draw_source_noise([1], frames * 480, 9)
        speech, source = hift(_mel(frames, frames), torch.zeros(1, 1, 0), noise)
    assert speech.shape == (1, frames * 480)
    assert source.shape == (1, 1, frames * 480)
    assert bool(torch.isfinite(speech).all())
    assert bool(speech.abs().max() <= torch.tensor(hift.config.audio_limit))  # float32 limit


def test_forward_never_touches_the_global_rng(hift: HiFTGenerator) -> None:
    before = torch.random.get_rng_state()
    with torch.inference_mode():
        hift(_mel(10, 1), torch.zeros(1, 1, 0), draw_source_noise([1], 4800, 9))
    assert torch.equal(before, torch.random.get_rng_state())


def test_cached_source_replaces_the_start_of_the_excitation(hift: HiFTGenerator) -> None:
    cache = torch.full((1, 1, 960), 0.25)
    with torch.inference_mode():
        _, source = hift(_mel(10, 2), cache, draw_source_noise([3], 4800, 9))
    assert torch.equal(source[:, :, :960], cache)


def test_fused_weight_norm_gives_identical_audio() -> None:
    model = build_hift(HiftConfig.tiny())
    initialise_hift(model, 4)
    mel, noise = _mel(12, 4), draw_source_noise([4], 12 * 480, 9)
    with torch.inference_mode():
        before, _ = model(mel, torch.zeros(1, 1, 0), noise)
        fuse_weight_norm(model)
        after, _ = model(mel, torch.zeros(1, 1, 0), noise)
    assert torch.equal(before, after)


def test_cross_fade_rounds_a_float64_sum_once_like_upstream() -> None:
    generator = torch.Generator().manual_seed(9)
    speech = torch.randn(2, HOLD + 100, generator=generator)
    tail = torch.randn(2, HOLD, generator=generator)
    original = speech.clone()
    window = torch.from_numpy(np.hamming(2 * HOLD))
    expected = (speech[:, :HOLD].double() * window[:HOLD] + tail.double() * window[HOLD:]).float()
    out = cross_fade(speech, tail)
    assert out.dtype == torch.float32
    assert torch.equal(out[:, :HOLD], expected)
    assert torch.equal(out[:, HOLD:], speech[:, HOLD:])
    assert torch.equal(speech, original)  # not modified in place


def test_stream_step_refuses_caches_of_different_shapes(hift: HiFTGenerator) -> None:
    empty = HiftCache.empty(hift.config)
    other = HiftCache(torch.zeros(80, 2), torch.zeros(960), torch.zeros(960))
    with pytest.raises(ValueError, match="equal shape"):
        stream_step(hift, [empty, other], _mel(4, 1, batch=2), False, [1, 2])


def _expected_emission(held: int, new_frames: int, final: bool) -> tuple[int, int]:
    """(emitted, held after) from the documented rule, in samples (480 per mel frame)."""
    total = held + new_frames * 480
    if final:
        return total, 0
    keep = min(HOLD, total)
    return total - keep, keep


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    schedule=st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=4),
    seed=st.integers(min_value=0, max_value=2**31),
)
def test_sample_counts_follow_the_hold_back_rule(
    hift: HiFTGenerator, schedule: list[int], seed: int
) -> None:
    """Mel windows of 2 x `tokens` frames; the last one is final. Per window: emitted =
    held + new - held_after; for the stream: sum = all mel frames x 480, nothing left held."""
    caches = [HiftCache.empty(hift.config)]
    emitted_total = 0
    with torch.inference_mode():
        for index, tokens in enumerate(schedule):
            final = index == len(schedule) - 1
            held = caches[0].held_samples
            step = stream_step(hift, caches, _mel(2 * tokens, seed + index), final, [seed])
            emitted, held_after = _expected_emission(held, 2 * tokens, final)
            assert step.audio[0].shape == (emitted,)
            if not final:
                assert step.caches[0].held_samples == held_after
                assert step.caches[0].mel.shape[1] == held_after // 480
                assert step.caches[0].source.shape == (held_after,)
            emitted_total += emitted
            caches = step.caches
    assert emitted_total == sum(schedule) * 2 * 480


def test_upstream_chunk_sizes_first_later_final(hift: HiFTGenerator) -> None:
    """MiniCPM-o's 25-token windows: 20160, then 24000, and the final one releases 3840."""
    caches = [HiftCache.empty(hift.config)]
    sizes = []
    with torch.inference_mode():
        for index, (frames, final) in enumerate([(50, False), (50, False), (6, True)]):
            step = stream_step(hift, caches, _mel(frames, index), final, [index])
            sizes.append(step.audio[0].shape[0])
            caches = step.caches
    assert sizes == [20160, 24000, 6 * 480 + HOLD]


def test_one_batched_hift_call_agrees_with_solo_to_float32_rounding(
    hift: HiFTGenerator,
) -> None:
    """Why the engine vocodes row by row on CPU: conv1d/linear/istft kernels round differently
    at batch 1 and batch > 1 (measured max diff ~1.6e-7). The batched call (the GPU default) must
    still agree to float32 rounding."""
    caches = [HiftCache.empty(hift.config)] * 3
    mel = _mel(20, 5, batch=3)
    with torch.inference_mode():
        batched = stream_step(hift, caches, mel, False, [1, 2, 3])
        for row in range(3):
            alone = stream_step(hift, caches[:1], mel[row : row + 1], False, [row + 1])
            torch.testing.assert_close(batched.audio[row], alone.audio[0], rtol=0, atol=2e-4)
