"""The causal HiFT (scheme B) inside the streaming engine: `Code2WavEngine(..., hift="causal")`.

Parity: a stream decoded window by window through the engine equals the flow's mel of each
window fed to minicpmo-utils 1.0.7's own `BoundedVocoder.stream` (+ the lead-in of
`Token2wav._stream_vocode`), on identical random weights and noise table, bit for bit (native
kernels, the CPU's row-by-row default). The flow itself is checked against its reference in
test_flow_parity.py; the causal vocoder alone in test_causal_hift_parity.py, whose helpers
(weights, upstream model, upstream stream) are reused here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codeclog.vocoder.checkpoint import load_fixture
from codeclog.vocoder.domain import engine_domain_suffix
from codeclog.vocoder.engine import Code2WavEngine, WindowRejectedError, WindowRejectReason
from codeclog.vocoder.engine.stream_state import StreamState
from codeclog.vocoder.errors import VocoderConfigError
from codeclog.vocoder.flow import canonical_windows
from codeclog.vocoder.hift.causal import CausalHiftConfig, build_causal_hift
from codeclog.vocoder.hift.causal_stream import emitted_samples
from tests.vocoder.reference import causal_upstream
from tests.vocoder.test_causal_hift_parity import UpstreamStream, parity_weights, upstream_model

pytestmark = pytest.mark.vocoder
IDS = [4218] * 3 + [(i * 7919 + 13) % 6561 for i in range(57)]  # 60 ids: 28, 28, final 10
WINDOWS = canonical_windows(IDS)
NEW_MEL_FRAMES = [2 * 25, 2 * 25, 2 * 10]


@pytest.fixture(scope="module")
def upstream() -> tuple[Any, Any, Any]:
    """minicpmo-utils 1.0.7's causal_vocoder modules (as test_causal_hift_parity loads them)."""
    return causal_upstream()


@pytest.fixture(scope="module")
def causal() -> Code2WavEngine:
    return Code2WavEngine.tiny(hift="causal", kernels="native", workers=1)


@pytest.fixture(scope="module")
def tiny_engine() -> Code2WavEngine:
    return Code2WavEngine.tiny(kernels="native", workers=1)


@pytest.fixture(scope="module")
def solo(causal: Code2WavEngine) -> dict[int, tuple[list[np.ndarray], StreamState]]:
    """WINDOWS decoded alone for stream seeds 1 and 2: (audio per window, final state)."""
    return {seed: _stream(causal, seed) for seed in (1, 2)}


def _stream(engine: Code2WavEngine, seed: int) -> tuple[list[np.ndarray], StreamState]:
    state = engine.setup(seed=seed)
    out = []
    for ids, final in WINDOWS:
        [(audio, state)] = engine.decode_batch([(state, ids, final)])
        out.append(audio)
    return out, state


def test_windows_follow_the_scheme_b_sample_rule(
    solo: dict[int, tuple[list[np.ndarray], StreamState]],
) -> None:
    """24000 samples per canonical window (the first: 3840 lead-in zeros + 20160), the final
    window its frames + the 3840 pending; samples_emitted is the running sum."""
    assert [(len(ids), final) for ids, final in WINDOWS] == [(28, False), (28, False), (10, True)]
    audio, state = solo[1]
    counts = [len(a) for a in audio]
    assert counts == emitted_samples(NEW_MEL_FRAMES) == [24000, 24000, 13440]
    assert not audio[0][:3840].any() and audio[0][3840:].any()
    assert state.samples_emitted == sum(counts) == sum(NEW_MEL_FRAMES) * 480 + 3840
    assert state.finished and state.held_samples == 0 and state.hift_variant == "causal"


def test_engine_stream_equals_upstream_bounded_vocoder(upstream: Any) -> None:
    flow, _ = load_fixture()
    model = build_causal_hift(CausalHiftConfig.tiny())
    parity_weights(model, seed=2)
    reference = upstream_model(upstream, CausalHiftConfig.tiny())
    reference.load_state_dict(model.state_dict(), strict=True)
    engine = Code2WavEngine(flow, model, kernels="native", workers=1)
    assert engine.causal is not None
    reference.m_source.l_sin_gen.sine_waves = engine.causal.noise_table[None].clone()
    expected_stream = UpstreamStream(upstream, reference)
    state = engine.setup(seed=5)
    for ids, final in WINDOWS:
        with engine.scope(), torch.inference_mode():  # the window's mel, as the engine makes it
            tokens = torch.tensor([ids], dtype=torch.long)
            mel, _ = engine.flow.decode_chunk_batch([state.flow], tokens, final)
        expected = expected_stream(mel.to(torch.float32), final)
        [(audio, state)] = engine.decode_batch([(state, ids, final)])
        assert np.array_equal(audio, expected.numpy()), (len(ids), final)


def test_state_round_trip_mid_stream_gives_identical_audio(
    causal: Code2WavEngine, solo: dict[int, tuple[list[np.ndarray], StreamState]]
) -> None:
    reference, _ = solo[1]
    state = causal.setup(seed=1)
    [(_, state)] = causal.decode_batch([(state, *WINDOWS[0])])
    data = state.to_bytes()
    restored = StreamState.from_bytes(data)
    assert restored.to_bytes() == data and restored.hift_variant == "causal"
    for (ids, final), expected in zip(WINDOWS[1:], reference[1:], strict=True):
        [(audio, restored)] = causal.decode_batch([(restored, ids, final)])
        assert np.array_equal(audio, expected)


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lengths=st.lists(st.integers(4, 30), min_size=0, max_size=2),
    last=st.integers(1, 30),
    cut=st.integers(0, 2),
    seed=st.integers(0, 2**31),
)
def test_any_schedule_follows_the_rule_and_survives_a_codec_round_trip(
    causal: Code2WavEngine, lengths: list[int], last: int, cut: int, seed: int
) -> None:
    """Any window schedule: each window's samples are emitted_samples over its new mel frames,
    and a state serialised after any window continues with the uninterrupted stream's bytes."""
    rng = np.random.default_rng(seed)
    schedule = [(n, False) for n in lengths] + [(last, True)]
    windows = [(rng.integers(0, 6561, n).tolist(), final) for n, final in schedule]
    cut = min(cut, len(windows) - 1)
    state = causal.setup(seed=seed)
    audio, snapshot = [], b""
    for index, (ids, final) in enumerate(windows):
        if index == cut:
            snapshot = state.to_bytes()
        [(samples, state)] = causal.decode_batch([(state, ids, final)])
        audio.append(samples)
    frames = [2 * (n if final else n - 3) for n, final in schedule]
    assert [len(a) for a in audio] == emitted_samples(frames)
    restored = StreamState.from_bytes(snapshot)
    for (ids, final), expected in zip(windows[cut:], audio[cut:], strict=True):
        [(samples, restored)] = causal.decode_batch([(restored, ids, final)])
        assert np.array_equal(samples, expected)


def test_batched_rows_equal_solo_rows(
    causal: Code2WavEngine, solo: dict[int, tuple[list[np.ndarray], StreamState]]
) -> None:
    """Two streams at the same position batch (equal signatures) and get their solo bytes."""
    states = [causal.setup(seed=seed) for seed in (1, 2)]
    assert states[0].signature() == states[1].signature()
    for index, (ids, final) in enumerate(WINDOWS):
        results = causal.decode_batch([(s, ids, final) for s in states])
        states = [state for _, state in results]
        for row, (audio, _) in enumerate(results):
            assert np.array_equal(audio, solo[row + 1][0][index]), (row, index)


def test_a_state_of_one_variant_is_refused_by_the_other(
    causal: Code2WavEngine, tiny_engine: Code2WavEngine
) -> None:
    ids, final = WINDOWS[0]
    foreign = StreamState.from_bytes(causal.setup(seed=1).to_bytes())
    with pytest.raises(WindowRejectedError, match="causal HiFT engine") as caught:
        tiny_engine.decode_batch([(foreign, ids, final)])
    assert caught.value.reason is WindowRejectReason.FOREIGN_STATE
    with pytest.raises(WindowRejectedError, match="noncausal HiFT engine"):
        causal.decode_batch([(tiny_engine.setup(seed=1), ids, final)])
    assert causal.setup().signature() != tiny_engine.setup().signature()


def test_the_variant_and_dtype_are_part_of_the_domain(
    causal: Code2WavEngine, tiny_engine: Code2WavEngine
) -> None:
    assert causal.domain == tiny_engine.domain + ":causal"
    assert causal.describe()["hift"] == "causal"
    assert tiny_engine.describe()["hift"] == "noncausal"
    assert engine_domain_suffix("float32", "noncausal", "exact") == ""  # defaults: bare domain
    assert engine_domain_suffix("bfloat16", "causal", "exact") == ":bfloat16:causal"
    assert engine_domain_suffix("float16", "noncausal", "ragged") == ":float16:ragged"


def test_ragged_batching_and_cpu_float16_are_refused() -> None:
    flow, _ = load_fixture()
    model = build_causal_hift(CausalHiftConfig.tiny())
    with pytest.raises(VocoderConfigError, match="cannot batch ragged"):
        Code2WavEngine(flow, model, batching="ragged")
    with pytest.raises(VocoderConfigError, match=r"float16 \(half precision\) is for CUDA"):
        Code2WavEngine(flow, model, dtype="float16")


def test_verify_replays_causal_audio_with_the_causal_hift() -> None:
    """verify's engine follows the audio's own variant (its domains); native kernels only
    when every window is in this machine's native domain with that variant."""
    from codeclog.cli.commands.verify import _engine_factory
    from codeclog.vocoder.domain import hift_variant_reproducing, kernels_reproducing
    from codeclog.vocoder.domain import planned_domain as planned
    from codeclog.vocoder.kernels import Kernels

    native = planned("cpu", Kernels.NATIVE)
    causal = frozenset({native + ":causal"})
    assert hift_variant_reproducing(causal) == "causal"
    assert hift_variant_reproducing(causal | {""}) == "causal"  # unknown (v1) windows: no say
    assert hift_variant_reproducing(causal | {native}) == "noncausal"
    assert hift_variant_reproducing(frozenset()) == "noncausal"
    assert kernels_reproducing(causal, "cpu", suffix=":causal") is Kernels.NATIVE
    assert kernels_reproducing(causal, "cpu") is Kernels.PORTABLE
    engine = _engine_factory("tiny", "cpu", "auto")(causal)
    assert engine.domain == native + ":causal"
