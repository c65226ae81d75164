"""Our flow against the upstream reference code (stepaudio2-minicpmo 0.1.1), same weights.

The upstream package is optional (`pip install --no-deps stepaudio2-minicpmo==0.1.1 einops`);
tests that run its modules skip without it. Its package `__init__` imports Token2wav and with it
torchaudio, s3tokenizer and ONNX models, so the submodules are imported under a bare package
object. `flow_matching` imports onnxruntime without using it; a stub stands in when it is
missing.

The reference is upstream's own streaming path: `setup_cache`, then `inference_chunk` per
window (encoder `forward_chunk`, CFM `forward_chunk` / `solve_euler_chunk`, DiT
`forward_chunk` / `blocks_forward_chunk` with their caches), then the trimming that upstream
`Token2wav.stream` applies between windows (copied below, since that class needs CUDA).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import importlib.util
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

from vocoder.flow import ConformerTrim, FlowConfig, FlowState, Token2WavFlow

pytestmark = pytest.mark.vocoder

DATA = Path(__file__).parent / "data"
TOLERANCE = 1e-4
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
    """The four upstream modules, imported without the package's heavy __init__."""

    def __init__(self) -> None:
        spec = importlib.util.find_spec("stepaudio2")
        if spec is None or spec.submodule_search_locations is None:
            pytest.skip("stepaudio2-minicpmo is not installed")
        pytest.importorskip("einops")
        if not hasattr(sys.modules.get("stepaudio2"), "__path__"):
            package = types.ModuleType("stepaudio2")
            package.__path__ = list(spec.submodule_search_locations)
            sys.modules["stepaudio2"] = package
        if importlib.util.find_spec("onnxruntime") is None:
            stub = types.ModuleType("onnxruntime")
            stub.__spec__ = importlib.machinery.ModuleSpec("onnxruntime", None)
            sys.modules["onnxruntime"] = stub
        base = "stepaudio2.cosyvoice2."
        self.flow = importlib.import_module(base + "flow.flow")
        self.cfm = importlib.import_module(base + "flow.flow_matching")
        self.dit = importlib.import_module(base + "flow.decoder_dit")
        self.encoder = importlib.import_module(base + "transformer.upsample_encoder_v2")

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


@dataclasses.dataclass
class Comparison:
    mel_diff: list[float]
    mel_frames: list[int]
    cache_lengths: list[tuple[int, int]]
    estimator_cache_diff: float


def compare_streams(upstream: Upstream, config: FlowConfig, prompt_tokens: int) -> Comparison:
    ours = Token2WavFlow(config)
    reference = upstream.build(config)
    reference.load_state_dict(ours.state_dict(), strict=True)
    reference.decoder.rand_noise = ours.decoder.noise.clone()  # the same noise table
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, config.vocab_size, (prompt_tokens,), generator=g)
    mel = torch.randn(2 * prompt_tokens, config.mel_dim, generator=g)
    spk = torch.randn(config.spk_embed_dim, generator=g)
    ids = torch.randint(0, config.vocab_size, (3 * 25 + 3 + 5,), generator=g)
    state = ours.prepare_prompt(tokens, mel, spk)
    with torch.inference_mode():
        setup = torch.cat([tokens, torch.full((3,), SILENCE)])[None]
        cache = reference.setup_cache(setup, mel[None], spk[None], config.n_timesteps)
        cache = {key: value.clone() for key, value in cache.items()}
    result = Comparison([], [], [], 0.0)
    for index in range(4):  # three canonical windows (trimming starts at the third), final
        last = index == 3
        window = ids[25 * index :] if last else ids[25 * index : 25 * index + 28]
        got, [state] = ours.decode_chunk_batch([state], window[None], last)
        with torch.inference_mode():
            want, cache = reference.inference_chunk(
                window[None], spk[None], cache, last_chunk=last, n_timesteps=config.n_timesteps
            )
            cache = upstream_trim(
                {k: v.clone() for k, v in cache.items()}, 2 * prompt_tokens, config
            )
        result.mel_diff.append(float((got - want).abs().max()))
        result.mel_frames.append(got.shape[2])
        result.cache_lengths.append((state.noise_offset, cache["estimator_att_cache"].shape[4]))
    steps = config.n_timesteps  # upstream returns all 16 scratch slots; the rest are unused
    diff = (state.estimator_att_cache - cache["estimator_att_cache"][:steps]).abs().max()
    result.estimator_cache_diff = float(diff)
    assert isinstance(state, FlowState)
    return result


@pytest.fixture(scope="module")
def upstream() -> Upstream:
    return Upstream()


@pytest.mark.parametrize("trim", list(ConformerTrim), ids=[t.value for t in ConformerTrim])
def test_tiny_stream_matches_upstream_streaming_path(
    upstream: Upstream, trim: ConformerTrim
) -> None:
    config = dataclasses.replace(FlowConfig.tiny(), conformer_trim=trim)
    result = compare_streams(upstream, config, prompt_tokens=25)
    assert result.mel_frames == [50, 50, 50, 16]
    # (ours, upstream) estimator cache lengths: 50 + 50k until trimmed back to P + 100 = 150
    assert result.cache_lengths == [(100, 100), (150, 150), (150, 150), (150, 150)]
    assert max(result.mel_diff) < TOLERANCE, result.mel_diff
    assert result.estimator_cache_diff < TOLERANCE


@pytest.mark.slow
def test_full_size_keys_and_shapes_equal_upstream(upstream: Upstream) -> None:
    ours = Token2WavFlow(FlowConfig.from_yaml(DATA / "flow.yaml"), device="meta")
    theirs = {k: tuple(v.shape) for k, v in upstream.build(FlowConfig.full()).state_dict().items()}
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == theirs
    manifest = json.loads((DATA / "flow_state_dict_shapes.json").read_text())["shapes"]
    assert {k: list(v) for k, v in theirs.items()} == manifest


@pytest.mark.slow
def test_full_size_stream_matches_upstream_streaming_path(upstream: Upstream) -> None:
    # Full sizes; 3 Euler steps instead of 10 keep this near a minute on 2 cores (the solver
    # loop is the same code for any step count; the tiny test runs all 10).
    config = dataclasses.replace(FlowConfig.full(), n_timesteps=3)
    result = compare_streams(upstream, config, prompt_tokens=10)
    assert result.mel_frames == [50, 50, 50, 16]
    assert result.cache_lengths == [(70, 70), (120, 120), (120, 120), (120, 120)]
    assert max(result.mel_diff) < TOLERANCE, result.mel_diff
    assert result.estimator_cache_diff < TOLERANCE
