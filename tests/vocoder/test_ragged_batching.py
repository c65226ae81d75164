"""Ragged batching (issue 23): one flow and one HiFT call per final flag, rows within the
documented bound of their solo decode (docs/vocoder.md, "Ragged batching")."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from codeclog.consumers.readers.audio_compare import Bound, compare_bound
from codeclog.vocoder.engine import Code2WavEngine
from codeclog.vocoder.engine.mixed_batch import decode_calls, mixed_position_items
from codeclog.vocoder.errors import VocoderConfigError
from codeclog.vocoder.flow import canonical_windows
from codeclog.vocoder.flow.ragged import decode_ragged
from codeclog.vocoder.shared import pcm_s16le

pytestmark = pytest.mark.vocoder
# Measured (docs/vocoder.md, "Ragged batching"): at most 1 LSB, SNR >= 74 dB; the test holds
# the cross-domain bound (32 LSB, 40 dB), far below what a misplaced frame or sample does
BOUND = Bound()
FLOW_TOLERANCE = 1e-4  # mel and caches: float rounding of other reduction widths only


@pytest.fixture(scope="module")
def engines() -> dict[str, Code2WavEngine]:
    return {
        mode: Code2WavEngine.from_spec("tiny", workers=1, batching=mode)
        for mode in ("exact", "ragged")
    }


def test_exact_is_the_default_and_unknown_modes_are_refused() -> None:
    engine = Code2WavEngine.from_spec("tiny", workers=1)
    assert engine.batching == "exact" and engine.describe()["batching"] == "exact"
    with pytest.raises(VocoderConfigError, match="batching"):
        Code2WavEngine.from_spec("tiny", batching="loose")


def test_ragged_with_portable_kernels_is_refused_at_construction() -> None:
    """The ragged rows' masks use an op the portable kernels lack (aten.__and__): refused when
    the engine is built, not on every window later (each would have failed `vocoder_failed`)."""
    with pytest.raises(VocoderConfigError, match="native kernels only"):
        Code2WavEngine.from_spec("tiny", batching="ragged", kernels="portable")


def test_a_mixed_step_takes_at_most_two_flow_and_two_hift_calls(
    engines: dict[str, Code2WavEngine],
) -> None:
    items = mixed_position_items(engines["ragged"], streams=10, max_windows=3)
    exact = engines["exact"]
    groups = exact._groups([exact._validate(i, item) for i, item in enumerate(items)])
    assert decode_calls(exact, items).flow == len(groups) > 2  # today: one per shape group
    ragged = decode_calls(engines["ragged"], items)
    assert ragged.flow == 2 and ragged.hift == 2  # non-final and final rows


def test_ragged_flow_rows_equal_solo_rows_within_rounding(
    engines: dict[str, Code2WavEngine],
) -> None:
    engine = engines["exact"]
    items = mixed_position_items(engine, streams=8, max_windows=3, seed=5)
    for final in (False, True):
        states = [s.flow for s, _, _ in items]
        windows = [list(ids)[: 10 if final else None] for _, ids, _ in items]
        with torch.inference_mode():
            mels, new = decode_ragged(engine.flow, states, windows, final)
            for state, ids, mel, row in zip(states, windows, mels, new, strict=True):
                solo_mel, [solo] = engine.flow.decode_chunk_batch(
                    [state], torch.tensor([ids]), final
                )
                assert mel.shape == solo_mel[0].shape
                assert float((mel - solo_mel[0]).abs().max()) < FLOW_TOLERANCE
                for name in ("conformer_att_cache", "estimator_att_cache", "estimator_cnn_cache"):
                    got, want = getattr(row, name), getattr(solo, name)
                    assert got.shape == want.shape, name
                    assert float((got - want).abs().max()) < FLOW_TOLERANCE, name
                assert row.chunks_done == solo.chunks_done and row.finished == solo.finished


def _streams(count: int, seed: int) -> list[list[tuple[tuple[int, ...], bool]]]:
    rng = random.Random(seed)
    lengths = [10, 30, 40, 60, 90, 130]
    return [
        canonical_windows([4218] * 3 + [rng.randrange(6561) for _ in range(rng.choice(lengths))])
        for _ in range(count)
    ]


def _decode_side_by_side(
    engine: Code2WavEngine,
    streams: list[list[tuple[tuple[int, ...], bool]]],
    seeds: list[int],
) -> list[list[np.ndarray]]:
    """Every stream advanced by one window per step, all in one decode_batch per step."""
    states = [engine.setup(seed=seed) for seed in seeds]
    audio: list[list[np.ndarray]] = [[] for _ in streams]
    position = [0] * len(streams)
    while True:
        rows = [s for s, windows in enumerate(streams) if position[s] < len(windows)]
        rows = [s for s in rows if streams[s][position[s]][0] or _skip(position, s)]
        if not rows:
            return audio
        items = [(states[s], *streams[s][position[s]]) for s in rows]
        for s, (samples, state) in zip(rows, engine.decode_batch(items), strict=True):
            states[s], position[s] = state, position[s] + 1
            audio[s].append(samples)


def _skip(position: list[int], s: int) -> bool:
    position[s] += 1  # an empty final window (the stream ended on a window boundary)
    return False


@pytest.mark.parametrize("workers", [1, 3])
def test_ragged_audio_is_within_the_documented_bound_of_solo(
    engines: dict[str, Code2WavEngine], workers: int
) -> None:
    """One ragged call per final flag, or one per decode worker, each taking a slice."""
    streams = _streams(8, seed=11)
    seeds = list(range(len(streams)))
    solo = [
        _decode_side_by_side(engines["exact"], [windows], [seed])[0]
        for windows, seed in zip(streams, seeds, strict=True)
    ]
    engine = engines["ragged"]
    if workers > 1:
        engine = Code2WavEngine.from_spec("tiny", workers=workers, batching="ragged")
        calls = decode_calls(engine, mixed_position_items(engine, streams=8, seed=3))
        assert 2 < calls.flow == calls.hift <= 2 * workers  # a slice per worker and final flag
    ragged = _decode_side_by_side(engine, streams, seeds)
    for windows, expected, actual in zip(streams, solo, ragged, strict=True):
        finals = [final for ids, final in windows if ids]
        assert [a.shape for a in actual] == [e.shape for e in expected]  # sample counts exact
        for final, e, a in zip(finals, expected, actual, strict=True):
            verdict = compare_bound(pcm_s16le(e), pcm_s16le(a), BOUND)
            assert verdict.ok, (final, verdict)
