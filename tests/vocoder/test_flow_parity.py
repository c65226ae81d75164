"""Our flow against the upstream reference code (stepaudio2-minicpmo 0.1.1), same weights.

The upstream package is a test dependency (`pip install --no-deps stepaudio2-minicpmo==0.1.1
einops scipy`); see tests/vocoder/reference.py for when its absence skips (a developer box) and
when it fails (CI, or any import error other than "not installed").

The reference is upstream's own streaming path: `setup_cache`, then `inference_chunk` per
window (encoder `forward_chunk`, CFM `forward_chunk` / `solve_euler_chunk`, DiT
`forward_chunk` / `blocks_forward_chunk` with their caches), then the trimming that upstream
`Token2wav.stream` applies between windows (copied below, since that class needs CUDA).
Upstream runs one request at a time (its scratch caches are sized for batch 1); ours decodes
the rows of a batch together.

Weights (`parity_flow`): every LayerNorm gets a random gain and bias, and the embedding
norms are scaled down so that conformer eps matters (see there); several seeds. The noise
table is drawn by each side where it draws it: upstream's CFM constructor from the global RNG
(seeded with `noise_seed` just before it), ours from a seeded generator; the test asserts the
two tables are equal instead of copying one into the other.

Tolerance: the largest difference measured (torch 2.15, AVX2, seeds 1-4, both trims, per
window over the batch) is 5.1e-7 of the largest mel magnitude (a few float32 ulps: the
batch-invariant GEMMs sum in another order than upstream's F.linear); REL_TOLERANCE is 8x that.
Mutations checked against it (each applied to a scratch copy of the code, these tests rerun
there), with the relative difference each produced:
- conformer LayerNorm eps 1e-12 -> 1e-5 (encoder.ConformerLayer): 3e-4 .. 6e-4 (with
  EMBED_NORM_GAIN = 1 it is 3e-7, invisible: hence the scaled-down embedding norms);
- LayerNorm bias sign flipped: in every affine norm (stable.layer_norm) 0.45 .. 0.6; only the
  DiT conv block's norm 0.03 .. 0.08; only the conformer's norm_ff 0.08 .. 0.19;
- guidance `(1 + rate) * v - rate * v_uncond` -> `(1 + rate) * v - v_uncond` (cfm): 0.14 .. 0.16.
With the previous weights (every LayerNorm weight 1, bias 0) the bias mutations and the eps
mutation passed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch import nn

from codeclog.vocoder.flow import ConformerTrim, FlowConfig, FlowState, Token2WavFlow
from tests.vocoder.reference import import_reference

pytestmark = pytest.mark.vocoder

DATA = Path(__file__).parent / "data"
REL_TOLERANCE = 4e-6  # 8x the largest measured difference, see the module docstring
EMBED_NORM_GAIN = 0.01
SEEDS = (1, 2)
SILENCE = 4218


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_full_size_keys_and_shapes_match_the_upstream_manifest() -> None:
    """Runs without the upstream package: the manifest was generated from its module tree."""
    manifest = json.loads((DATA / "flow_state_dict_shapes.json").read_text())["shapes"]
    ours = Token2WavFlow(FlowConfig.from_yaml(DATA / "flow.yaml"), device="meta")
    assert {k: list(v.shape) for k, v in ours.state_dict().items()} == manifest


def test_full_size_model_has_155_8m_parameters() -> None:
    ours = Token2WavFlow(FlowConfig.full(), device="meta")
    assert sum(p.numel() for p in ours.parameters()) == 155_802_352


class Upstream:
    """The four upstream modules (tests/vocoder/reference.py: skip or fail, never silently)."""

    def __init__(self) -> None:
        self.flow, self.cfm, self.dit, self.encoder = import_reference(
            "cosyvoice2.flow.flow",
            "cosyvoice2.flow.flow_matching",
            "cosyvoice2.flow.decoder_dit",
            "cosyvoice2.transformer.upsample_encoder_v2",
        )

    def build(self, c: FlowConfig) -> Any:
        """CausalMaskedDiffWithXvec with flow.yaml's keyword arguments, scratch buffers sized
        for `c` (upstream hard-codes them for the full model, batch 1)."""
        with torch.random.fork_rng(devices=[]):  # upstream initialises from the global RNG
            encoder = self.encoder.UpsampleConformerEncoderV2(
                input_size=c.input_size,
                output_size=c.input_size,
                input_layer="linear",
                pre_lookahead_len=c.pre_lookahead_len,
                num_blocks=c.encoder_blocks,
                num_up_blocks=c.encoder_up_blocks,
                up_stride=c.token_mel_ratio,
                up_scale_factor=c.token_mel_ratio,
                attention_heads=c.encoder_heads,
                pos_enc_layer_type="rel_pos_espnet",
                selfattention_layer_type="rel_selfattn",
                key_bias=c.encoder_key_bias,
                linear_units=c.encoder_linear_units,
                dropout_rate=0.1,
                positional_dropout_rate=0.1,
                attention_dropout_rate=0.1,
                normalize_before=True,
            )
            estimator = self.dit.DiT(
                in_channels=c.estimator_in_channels,
                out_channels=c.mel_dim,
                mlp_ratio=c.dit_mlp_ratio,
                depth=c.dit_depth,
                num_heads=c.dit_heads,
                head_dim=c.dit_head_dim,
                hidden_size=c.dit_hidden_size,
            )
            # upstream draws its noise table (randn(1, 80, 50 * 600)) from the global RNG when
            # the CFM is built: seeded with our noise_seed there, it must equal our table
            torch.manual_seed(c.noise_seed)
            decoder = self.cfm.CausalConditionalCFM(estimator, c.inference_cfg_rate)
            model = self.flow.CausalMaskedDiffWithXvec(
                input_size=c.input_size,
                output_size=c.mel_dim,
                spk_embed_dim=c.spk_embed_dim,
                output_type="mel",
                vocab_size=c.vocab_size,
                encoder=encoder,
                decoder=decoder,
            )
        if c != FlowConfig.full():
            heads, hd, hidden, depth = c.dit_heads, c.dit_head_dim, c.dit_hidden_size, c.dit_depth
            estimator.cnn_cache_buffer = torch.zeros(depth, 2, 2 * hidden, 2)
            estimator.att_cache_buffer = torch.zeros(depth, 2, heads, 1000, 2 * hd)
            decoder.cnn_cache_buffer = torch.zeros(16, depth, 2, 2 * hidden, 2)
            decoder.att_cache_buffer = torch.zeros(16, depth, 2, heads, 1000, 2 * hd)
        return model.eval()


def upstream_trim(cache: dict[str, Any], prompt_frames: int, c: FlowConfig) -> dict[str, Any]:
    """Token2wav.stream's trimming: 0.1.1 / 1.0.5 (packed) or 1.0.7 (_trim_conformer_cache)."""
    limit, keep = prompt_frames + 100, 100
    est = cache["estimator_att_cache"]
    if est.shape[4] > limit:
        cache["estimator_att_cache"] = torch.cat(
            [est[:, :, :, :, :prompt_frames], est[:, :, :, :, -keep:]], dim=4
        )
    att = cache["conformer_att_cache"]
    if att.shape[3] <= limit:
        return cache
    if c.conformer_trim is ConformerTrim.PACKED:
        cache["conformer_att_cache"] = torch.cat(
            [att[:, :, :, :prompt_frames, :], att[:, :, :, -keep:, :]], dim=3
        )
        return cache
    depth = c.encoder_blocks
    token = att[:depth, :, :, : att.shape[3] // 2]
    token = torch.cat(
        [token[:, :, :, : prompt_frames // 2], token[:, :, :, token.shape[3] - keep // 2 :]], dim=3
    )
    mel = torch.cat(
        [att[depth:, :, :, :prompt_frames], att[depth:, :, :, att.shape[3] - keep :]], 3
    )
    cache["conformer_att_cache"] = torch.cat([token.repeat(1, 1, 1, 2, 1), mel], dim=0)
    return cache


def parity_flow(config: FlowConfig, seed: int) -> Token2WavFlow:
    """Weights that exercise every parameter: the seeded uniform init for linears, convs and
    embeddings (`init_seed` = seed), then random LayerNorm gains U(0.5, 1.5) and biases
    U(-0.5, 0.5) (the init's 1 and 0 would make a dropped or sign-flipped gain or bias
    invisible).

    The two embedding LayerNorms (`embed.out.1`, `up_embed.out.1`) are scaled by EMBED_NORM_GAIN,
    so each conformer stack starts on a residual stream of variance about 1e-4: there a
    LayerNorm eps of 1e-5 instead of 1e-12 changes the output by percent. With unit-variance
    inputs, as everywhere else, an eps error of 1e-5 is below float32 resolution.
    """
    flow = Token2WavFlow(dataclasses.replace(config, init_seed=seed))
    generator = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for name, sub in flow.named_modules():
            if isinstance(sub, nn.LayerNorm) and sub.weight is not None:
                gain = EMBED_NORM_GAIN if name.endswith("embed.out.1") else 1.0
                sub.weight.uniform_(0.5, 1.5, generator=generator).mul_(gain)
                sub.bias.uniform_(-0.5, 0.5, generator=generator).mul_(gain)
    return flow


@dataclasses.dataclass
class Comparison:
    mel_rel: list[float]  # per window: max |ours - upstream| / max |upstream| over the rows
    mel_frames: list[int]
    cache_lengths: list[tuple[int, int]]  # per window, row 0: (ours, upstream)
    estimator_cache_rel: float
    rows_differ: bool  # the batch rows got different mels (they had different inputs)


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


@dataclasses.dataclass(frozen=True)
class _Inputs:
    tokens: torch.Tensor
    mel: torch.Tensor
    spk: torch.Tensor
    ids: torch.Tensor


def _inputs(config: FlowConfig, seed: int, prompt_tokens: int, windows: int) -> _Inputs:
    g = torch.Generator().manual_seed(seed)
    return _Inputs(
        tokens=torch.randint(0, config.vocab_size, (prompt_tokens,), generator=g),
        mel=torch.randn(2 * prompt_tokens, config.mel_dim, generator=g),
        spk=torch.randn(config.spk_embed_dim, generator=g),
        ids=torch.randint(0, config.vocab_size, (25 * windows + 3 + 5,), generator=g),
    )


def _window(ids: torch.Tensor, index: int, last: bool) -> torch.Tensor:
    return ids[25 * index :] if last else ids[25 * index : 25 * index + 28]


def _upstream_stream(
    reference: Any, config: FlowConfig, row: _Inputs, windows: int, prompt_tokens: int
) -> tuple[list[torch.Tensor], list[int], torch.Tensor]:
    """One request through upstream's streaming path (batch 1, as Token2wav.stream runs it)."""
    with torch.inference_mode():
        setup = torch.cat([row.tokens, torch.full((3,), SILENCE)])[None]
        cache = reference.setup_cache(setup, row.mel[None], row.spk[None], config.n_timesteps)
        cache = {key: value.clone() for key, value in cache.items()}
        mels, lengths = [], []
        for index in range(windows + 1):
            last = index == windows
            want, cache = reference.inference_chunk(
                _window(row.ids, index, last)[None],
                row.spk[None],
                cache,
                last_chunk=last,
                n_timesteps=config.n_timesteps,
            )
            cache = upstream_trim(
                {k: v.clone() for k, v in cache.items()}, 2 * prompt_tokens, config
            )
            mels.append(want[0].clone())
            lengths.append(cache["estimator_att_cache"].shape[4])
    # upstream returns all 16 scratch slots; the rest are unused
    return mels, lengths, cache["estimator_att_cache"][: config.n_timesteps, :, :].clone()


def compare_streams(
    upstream: Upstream,
    config: FlowConfig,
    prompt_tokens: int,
    *,
    seed: int = 7,
    batch: int = 1,
    windows: int = 3,
) -> Comparison:
    """`batch` requests (same prompt length, different prompts, speakers and ids) decoded by us
    in one batch per window; each request decoded alone by upstream; weights from `seed`."""
    ours = parity_flow(config, seed)
    config = ours.config
    reference = upstream.build(config)
    reference.load_state_dict(ours.state_dict(), strict=True)
    # each side drew its own noise table where it draws it (ours: FlowConfig.noise_seed)
    assert torch.equal(reference.decoder.rand_noise, ours.decoder.noise)
    rows = [_inputs(config, 100 * seed + row, prompt_tokens, windows) for row in range(batch)]
    expected = [_upstream_stream(reference, config, row, windows, prompt_tokens) for row in rows]
    states = [ours.prepare_prompt(row.tokens, row.mel, row.spk) for row in rows]
    result = Comparison([], [], [], 0.0, False)
    for index in range(windows + 1):
        last = index == windows
        window = torch.stack([_window(row.ids, index, last) for row in rows])
        got, states = ours.decode_chunk_batch(states, window, last)
        want = torch.stack([mels[index] for mels, _, _ in expected])
        result.mel_rel.append(_relative(got, want))
        result.mel_frames.append(got.shape[2])
        result.cache_lengths.append((states[0].noise_offset, expected[0][1][index]))
        if batch > 1:
            result.rows_differ |= not torch.equal(got[0], got[1])
    result.estimator_cache_rel = max(
        _relative(state.estimator_att_cache, final_cache)
        for state, (_, _, final_cache) in zip(states, expected, strict=True)
    )
    assert all(isinstance(state, FlowState) for state in states)
    return result


@pytest.fixture(scope="module")
def upstream() -> Upstream:
    return Upstream()


@pytest.mark.parametrize(
    ("trim", "seed"),
    [(trim, seed) for trim in ConformerTrim for seed in SEEDS],
    ids=[f"{trim.value}-seed{seed}" for trim in ConformerTrim for seed in SEEDS],
)
def test_tiny_batched_stream_matches_upstream_streaming_path(
    upstream: Upstream, trim: ConformerTrim, seed: int
) -> None:
    """Batch 2 (ours in one batch, upstream one request at a time), a 60-token prompt, five
    windows (both attention caches trimmed from the fourth on) and the final one.

    Mutations this test was checked to catch (each applied to a copy of the code, see the
    module docstring): conformer LayerNorm eps 1e-12 -> 1e-5 (encoder.ConformerLayer); a
    flipped LayerNorm bias sign (all affine norms, or only the DiT conv block's); a changed
    guidance formula (cfm: `- rate * cfg` -> `- cfg`).
    """
    config = dataclasses.replace(FlowConfig.tiny(), conformer_trim=trim)
    result = compare_streams(upstream, config, prompt_tokens=60, seed=seed, batch=2, windows=5)
    assert result.mel_frames == [50, 50, 50, 50, 50, 16]
    # (ours, upstream) estimator cache lengths: 120 + 50k until trimmed back to P + 100 = 220
    assert result.cache_lengths == [(170, 170), (220, 220)] + [(220, 220)] * 4
    assert result.rows_differ
    assert max(result.mel_rel) < REL_TOLERANCE, result.mel_rel
    assert result.estimator_cache_rel < REL_TOLERANCE, result.estimator_cache_rel


@pytest.mark.slow
def test_full_size_keys_and_shapes_equal_upstream(upstream: Upstream) -> None:
    ours = Token2WavFlow(FlowConfig.from_yaml(DATA / "flow.yaml"), device="meta")
    theirs = {k: tuple(v.shape) for k, v in upstream.build(FlowConfig.full()).state_dict().items()}
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == theirs
    manifest = json.loads((DATA / "flow_state_dict_shapes.json").read_text())["shapes"]
    assert {k: list(v) for k, v in theirs.items()} == manifest


@pytest.mark.slow
@pytest.mark.long  # 29 s of CI; the tiny streams above run the same code, and the full-size
# keys and shapes are checked against upstream in CI
def test_full_size_stream_matches_upstream_streaming_path(upstream: Upstream) -> None:
    # Full sizes; 3 Euler steps instead of 10 keep this near a minute on 2 cores (the solver
    # loop is the same code for any step count; the tiny test runs all 10).
    config = dataclasses.replace(FlowConfig.full(), n_timesteps=3)
    result = compare_streams(upstream, config, prompt_tokens=10)
    assert result.mel_frames == [50, 50, 50, 16]
    assert result.cache_lengths == [(70, 70), (120, 120), (120, 120), (120, 120)]
    assert max(result.mel_rel) < REL_TOLERANCE, result.mel_rel
    assert result.estimator_cache_rel < REL_TOLERANCE
