"""FlowConfig: the published sizes, the tiny sizes, and the restricted flow.yaml reader."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("yaml")

from codeclog.vocoder.flow import ConformerTrim, FlowConfig, FlowConfigError
from codeclog.vocoder.flow.config import KNOWN_TAGS

pytestmark = pytest.mark.vocoder

FLOW_YAML = Path(__file__).parent / "data" / "flow.yaml"


def published_text() -> str:
    return FLOW_YAML.read_text()


def test_published_flow_yaml_gives_the_full_config() -> None:
    assert FlowConfig.from_yaml(FLOW_YAML) == FlowConfig.full()


def test_full_config_has_the_published_sizes() -> None:
    config = FlowConfig.full()
    assert (config.vocab_size, config.input_size, config.mel_dim, config.spk_embed_dim) == (
        6561,
        512,
        80,
        192,
    )
    assert (config.encoder_blocks, config.encoder_up_blocks, config.encoder_heads) == (6, 4, 8)
    assert (config.dit_depth, config.dit_hidden_size, config.dit_heads, config.dit_head_dim) == (
        16,
        512,
        8,
        64,
    )
    assert (config.n_timesteps, config.inference_cfg_rate, config.att_keep_frames) == (10, 0.7, 100)
    assert config.estimator_in_channels == 320


def test_tiny_keeps_the_interface_sizes() -> None:
    tiny, full = FlowConfig.tiny(), FlowConfig.full()
    interface = ("vocab_size", "mel_dim", "spk_embed_dim", "token_mel_ratio", "pre_lookahead_len")
    for name in interface:
        assert getattr(tiny, name) == getattr(full, name), name
    assert tiny.input_size == 32 and tiny.dit_hidden_size == 32 and tiny.dit_depth == 2


def test_solver_settings_are_not_in_flow_yaml_and_keep_defaults() -> None:
    config = dataclasses.replace(FlowConfig.from_yaml(FLOW_YAML), n_timesteps=4, noise_seed=9)
    assert config.n_timesteps == 4 and config.noise_seed == 9


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(FlowConfigError, match="cannot read"):
        FlowConfig.from_yaml(tmp_path / "absent.yaml")


# (case id, text edit as (old, new), expected message fragment)
REFUSED_YAML = [
    ("arbitrary-constructor", ("!new:cosyvoice2.flow.decoder_dit.DiT", "!new:os.system"), "not a"),
    (
        "python-object-tag",
        ("!new:cosyvoice2.flow.decoder_dit.DiT", "!!python/object/apply:os.system"),
        "not a",
    ),
    (
        "hyperpyyaml-apply",
        ("flow: !new", "seed: !apply:torch.manual_seed [1986]\nflow: !new"),
        "not a",
    ),
    (
        "unknown-top-level-key",
        ("flow: !new", "sample_rate: 24000\nflow: !new"),
        "unknown top-level",
    ),
    (
        "unknown-flow-key",
        ("    vocab_size: 6561", "    vocab_size: 6561\n    extra: 1"),
        "unknown keys",
    ),
    (
        "unknown-encoder-key",
        ("        num_blocks: 6", "        num_blocks: 6\n        foo: 2"),
        "foo",
    ),
    ("wrong-output-type", ("output_type: 'mel'", "output_type: 'linear'"), "output_type"),
    ("wrong-attention", ("'rel_selfattn'", "'selfattn'"), "selfattention_layer_type"),
    ("encoder-width", ("        output_size: 512", "        output_size: 256"), "output_size"),
    ("scale-not-stride", ("up_scale_factor: 2", "up_scale_factor: 3"), "up_scale_factor"),
    ("estimator-in", ("in_channels: 320", "in_channels: 240"), "in_channels"),
    ("estimator-out", ("out_channels: 80", "out_channels: 100"), "out_channels"),
    ("string-for-int", ("depth: 16", "depth: 'sixteen'"), "depth"),
    ("bool-for-int", ("num_heads: 8", "num_heads: true"), "num_heads"),
    ("missing-vocab", ("    vocab_size: 6561\n", ""), "vocab_size"),
    ("missing-estimator", ("        estimator: !new:", "        other: !new:"), "unknown keys"),
    ("zero-depth", ("depth: 16", "depth: 0"), "dit_depth"),
    ("not-a-mapping", ("flow: !new", "flow: [1, 2]\nunused: !new"), "unknown top-level"),
]


@pytest.mark.parametrize(
    ("edit", "message"), [(e, m) for _, e, m in REFUSED_YAML], ids=[c for c, _, _ in REFUSED_YAML]
)
def test_restricted_loader_refuses(edit: tuple[str, str], message: str) -> None:
    text = published_text()
    assert edit[0] in text, "the case must edit the fixture"
    with pytest.raises(FlowConfigError, match=message):
        FlowConfig.from_yaml_text(text.replace(edit[0], edit[1], 1))


def test_only_the_four_component_tags_are_known() -> None:
    assert len(KNOWN_TAGS) == 4
    assert all(tag.startswith("!new:cosyvoice2.") for tag in KNOWN_TAGS)


# (case id, overrides, expected message fragment)
BAD_CONFIGS = [
    ("zero-vocab", {"vocab_size": 0}, "vocab_size"),
    ("negative-keep", {"att_keep_frames": -2}, "att_keep_frames"),
    ("odd-keep", {"att_keep_frames": 101}, "multiple of token_mel_ratio"),
    ("heads-not-dividing", {"input_size": 30, "encoder_heads": 4}, "multiple of encoder_heads"),
    ("zero-cfg", {"inference_cfg_rate": 0.0}, "inference_cfg_rate"),
    ("float-size", {"dit_depth": 2.0}, "dit_depth"),
    ("bool-size", {"dit_depth": True}, "dit_depth"),
    ("string-rate", {"inference_cfg_rate": "0.7"}, "inference_cfg_rate"),
    ("silence-out-of-range", {"setup_lookahead_token": 6561}, "setup_lookahead_token"),
    ("trim-not-enum", {"conformer_trim": "packed"}, "conformer_trim"),
]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [(o, m) for _, o, m in BAD_CONFIGS],
    ids=[c for c, _, _ in BAD_CONFIGS],
)
def test_config_refuses(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(FlowConfigError, match=message):
        dataclasses.replace(FlowConfig.tiny(), **overrides)  # type: ignore[arg-type]


def test_conformer_trim_values_are_stable() -> None:
    assert {trim.value for trim in ConformerTrim} == {"per_scale", "packed"}
