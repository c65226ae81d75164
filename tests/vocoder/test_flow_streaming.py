"""Streaming rules of the flow: window sizes, trimming bounds, refusals, no global RNG."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch

from codeclog.vocoder.errors import VocoderInputError
from codeclog.vocoder.flow import (
    ConformerTrim,
    FlowInputError,
    FlowRejectReason,
    FlowState,
    Token2WavFlow,
    canonical_windows,
)
from tests.vocoder.flow_helpers import PROMPT_TOKENS, prompt, random_ids, tiny_flow

pytestmark = pytest.mark.vocoder


@pytest.fixture(scope="module")
def flow() -> Token2WavFlow:
    return tiny_flow()


def ids(seed: int, count: int, batch: int = 1) -> torch.Tensor:
    return random_ids(seed, batch, count)


@pytest.fixture(scope="module")
def setup_state(flow: Token2WavFlow) -> FlowState:
    return prompt(flow, seed=1)


def test_prompt_state_shapes(flow: Token2WavFlow, setup_state: FlowState) -> None:
    c = flow.config
    frames = 2 * PROMPT_TOKENS
    assert setup_state.prompt_frames == frames and setup_state.chunks_done == 0
    assert tuple(setup_state.conformer_cnn_cache.shape) == (c.input_size, 6)
    layers, d_k = c.encoder_blocks + c.encoder_up_blocks, c.encoder_head_dim
    assert tuple(setup_state.conformer_att_cache.shape) == (
        layers,
        c.encoder_heads,
        frames,
        2 * d_k,
    )
    assert tuple(setup_state.estimator_cnn_cache.shape) == (
        c.n_timesteps,
        c.dit_depth,
        2,
        2 * c.dit_hidden_size,
        2,
    )
    assert tuple(setup_state.estimator_att_cache.shape) == (
        c.n_timesteps,
        c.dit_depth,
        2,
        c.dit_heads,
        frames,
        2 * c.dit_head_dim,
    )
    assert setup_state.noise_offset == frames


# (case id, window ids, last_chunk, mel frames)
WINDOW_SIZES = [
    ("canonical", 28, False, 50),
    ("short-duplex-unit", 8, False, 10),
    ("minimum-nonfinal", 4, False, 2),
    ("final-canonical", 28, True, 56),
    ("final-lookahead-only", 3, True, 6),
    ("final-one", 1, True, 2),
    ("final-empty", 0, True, 0),
]


@pytest.mark.parametrize(
    ("count", "last", "frames"),
    [(n, last, f) for _, n, last, f in WINDOW_SIZES],
    ids=[c for c, *_ in WINDOW_SIZES],
)
def test_window_yields_ratio_times_fresh_tokens(
    flow: Token2WavFlow, setup_state: FlowState, count: int, last: bool, frames: int
) -> None:
    mel, [state] = flow.decode_chunk_batch([setup_state], ids(2, count), last)
    assert tuple(mel.shape) == (1, 80, frames)
    assert flow.output_frames(count, last) == frames
    assert bool(torch.isfinite(mel).all())
    assert state.finished is last
    if count:
        assert state.chunks_done == 1
        assert state.noise_offset == min(setup_state.noise_offset + frames, 24 + 100)


def test_decode_never_mutates_its_inputs(flow: Token2WavFlow, setup_state: FlowState) -> None:
    before = setup_state.to_bytes()
    tokens = ids(3, 28)
    copy = tokens.clone()
    flow.decode_chunk_batch([setup_state], tokens, False)
    assert setup_state.to_bytes() == before and torch.equal(tokens, copy)


def test_one_fresh_frame_window_can_continue(flow: Token2WavFlow, setup_state: FlowState) -> None:
    # Regression: upstream keeps conv1_out[..., -2:] as the conv2 cache, so after a 4-id window
    # (1 fresh id) its cache is 1 frame long and its next call fails an assertion.
    _, [state] = flow.decode_chunk_batch([setup_state], ids(4, 4), False)
    assert tuple(state.conformer_cnn_cache.shape) == (flow.config.input_size, 6)
    mel, _ = flow.decode_chunk_batch([state], ids(5, 28), False)
    assert tuple(mel.shape) == (1, 80, 50)


@pytest.mark.parametrize("trim", list(ConformerTrim), ids=[t.value for t in ConformerTrim])
def test_state_stops_growing_at_prompt_plus_keep_frames(trim: ConformerTrim) -> None:
    flow = tiny_flow(conformer_trim=trim, n_timesteps=2)
    state = prompt(flow, seed=6)
    limit = state.prompt_frames + flow.config.att_keep_frames
    sizes = []
    for window, last in canonical_windows(ids(7, 25 * 6 + 3)[0].tolist())[:-1]:
        _, [state] = flow.decode_chunk_batch([state], torch.tensor([window]), last)
        assert state.conformer_att_cache.shape[2] <= limit
        assert state.noise_offset <= limit
        sizes.append(state.nbytes)
    assert state.noise_offset == limit  # the noise offset stays at P + keep (upstream)
    assert sizes[-1] == sizes[-2] == sizes[-3] == max(sizes)


# (case id, window ids, last_chunk, reason)
def _refusals() -> list[tuple[str, torch.Tensor, bool, FlowRejectReason]]:
    return [
        (
            "nonfinal-lookahead-only",
            ids(1, 3),
            False,
            FlowRejectReason.CHUNK_BELOW_LOOKAHEAD_WINDOW,
        ),
        ("nonfinal-empty", ids(1, 0), False, FlowRejectReason.CHUNK_BELOW_LOOKAHEAD_WINDOW),
        (
            "id-6561-eos",
            torch.tensor([[1, 2, 3, 6561, 5]]),
            False,
            FlowRejectReason.TOKEN_OUT_OF_RANGE,
        ),
        (
            "negative-id",
            torch.tensor([[1, -1, 3, 4, 5]]),
            True,
            FlowRejectReason.TOKEN_OUT_OF_RANGE,
        ),
        ("float-ids", torch.zeros(1, 28), False, FlowRejectReason.TOKEN_SHAPE),
        ("one-dim", torch.zeros(28, dtype=torch.long), False, FlowRejectReason.TOKEN_SHAPE),
        ("batch-mismatch", ids(1, 28, batch=2), False, FlowRejectReason.TOKEN_SHAPE),
    ]


@pytest.mark.parametrize(
    ("tokens", "last", "reason"),
    [(t, last, r) for _, t, last, r in _refusals()],
    ids=[c for c, *_ in _refusals()],
)
def test_refused_windows(
    flow: Token2WavFlow,
    setup_state: FlowState,
    tokens: torch.Tensor,
    last: bool,
    reason: FlowRejectReason,
) -> None:
    with pytest.raises(FlowInputError) as caught:
        flow.decode_chunk_batch([setup_state], tokens, last)
    assert caught.value.reason is reason
    assert isinstance(caught.value, VocoderInputError)


def test_finished_state_is_refused(flow: Token2WavFlow, setup_state: FlowState) -> None:
    _, [done] = flow.decode_chunk_batch([setup_state], ids(1, 5), True)
    with pytest.raises(FlowInputError) as caught:
        flow.decode_chunk_batch([done], ids(1, 28), False)
    assert caught.value.reason is FlowRejectReason.STREAM_FINISHED


def test_empty_batch_is_refused(flow: Token2WavFlow) -> None:
    with pytest.raises(FlowInputError) as caught:
        flow.decode_chunk_batch([], ids(1, 28, batch=0), False)
    assert caught.value.reason is FlowRejectReason.EMPTY_BATCH


def test_state_of_another_config_is_refused(flow: Token2WavFlow) -> None:
    other = tiny_flow(n_timesteps=3)
    with pytest.raises(FlowInputError) as caught:
        flow.decode_chunk_batch([prompt(other, seed=1)], ids(1, 28), False)
    assert caught.value.reason is FlowRejectReason.STATE_SIGNATURE_MISMATCH


def test_noise_capacity_is_checked_before_compute() -> None:
    flow = tiny_flow(noise_frames=60)
    state = prompt(flow, seed=1, tokens=10)  # 20 prompt frames
    with pytest.raises(FlowInputError) as caught:
        flow.decode_chunk_batch([state], ids(1, 28), False)  # 20 + 50 > 60
    assert caught.value.reason is FlowRejectReason.NOISE_CAPACITY


# (case id, prompt ids, prompt mel shape, speaker shape)
BAD_PROMPTS = [
    ("no-tokens", torch.zeros(0, dtype=torch.long), (0, 80), (192,)),
    ("mel-too-short", torch.zeros(5, dtype=torch.long), (9, 80), (192,)),
    ("mel-wrong-bins", torch.zeros(5, dtype=torch.long), (10, 40), (192,)),
    ("speaker-size", torch.zeros(5, dtype=torch.long), (10, 80), (80,)),
    ("float-ids", torch.zeros(5), (10, 80), (192,)),
    ("id-out-of-range", torch.full((5,), 7000), (10, 80), (192,)),
]


@pytest.mark.parametrize(
    ("tokens", "mel_shape", "spk_shape"),
    [(t, m, s) for _, t, m, s in BAD_PROMPTS],
    ids=[c for c, *_ in BAD_PROMPTS],
)
def test_bad_prompts_are_refused(
    flow: Token2WavFlow,
    tokens: torch.Tensor,
    mel_shape: tuple[int, int],
    spk_shape: tuple[int],
) -> None:
    with pytest.raises(FlowInputError):
        flow.prepare_prompt(tokens, torch.zeros(mel_shape), torch.zeros(spk_shape))


def test_building_and_decoding_leave_the_global_rng_alone() -> None:
    before = torch.random.get_rng_state()
    flow = tiny_flow(n_timesteps=2)
    state = prompt(flow, seed=1)
    flow.decode_chunk_batch([state], ids(1, 28), False)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_two_builds_have_identical_weights_and_noise() -> None:
    a, b = tiny_flow(), tiny_flow()
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())
    assert torch.equal(a.decoder.noise, b.decoder.noise)
    reseeded = tiny_flow(noise_seed=1)
    assert not torch.equal(a.decoder.noise, reseeded.decoder.noise)


# (case id, stream length, expected (window length, last) list)
WINDOW_PLANS = [
    ("empty", 0, [(0, True)]),
    ("short", 10, [(10, True)]),
    ("one-window-exact", 28, [(28, False), (3, True)]),
    ("two-windows", 60, [(28, False), (28, False), (10, True)]),
]


@pytest.mark.parametrize(
    ("length", "plan"), [(n, p) for _, n, p in WINDOW_PLANS], ids=[c for c, *_ in WINDOW_PLANS]
)
def test_canonical_windows(length: int, plan: list[tuple[int, bool]]) -> None:
    stream = list(range(length))
    windows = canonical_windows(stream)
    assert [(len(w), last) for w, last in windows] == plan
    fresh = [w[: len(w) - 3] if not last else w for w, last in windows]
    assert [t for chunk in fresh for t in chunk] == stream  # every id is decoded exactly once


def test_time_conditioning_is_kept_until_a_weight_it_reads_changes() -> None:
    """The solver keeps every step's modulations across windows; an in-place change of a
    weight they are computed from (a new version) or new weights (load_state_dict) makes it
    compute them again: the window then equals a new flow's with the same weights."""
    kept = tiny_flow(n_timesteps=4)
    original = {name: value.clone() for name, value in kept.state_dict().items()}
    state = prompt(kept, seed=2)
    window = ids(5, 28)
    before, _ = kept.decode_chunk_batch([state], window, False)
    with torch.no_grad():
        kept.decoder.estimator.blocks[0].adaLN_modulation[1].weight.mul_(1.5)
    after, _ = kept.decode_chunk_batch([state], window, False)
    fresh = tiny_flow(n_timesteps=4)  # nothing kept yet
    fresh.load_state_dict(kept.state_dict())
    expected, _ = fresh.decode_chunk_batch([state], window, False)
    assert not torch.equal(before, after)
    assert torch.equal(after, expected)
    kept.load_state_dict(original)
    reloaded, _ = kept.decode_chunk_batch([state], window, False)
    assert torch.equal(reloaded, before)
