"""Loading weights: checkpoint directory layouts, strict loading, the tiny fixture, voice files."""

from __future__ import annotations

import dataclasses
import datetime
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from codeclog.vocoder.checkpoint import (
    TINY_CONFIG,
    TINY_WEIGHTS,
    FixtureManifest,
    flow_config_from_dict,
    flow_config_to_dict,
    inspect_checkpoint,
    load_checkpoint,
    load_fixture,
    read_torch_weights,
)
from codeclog.vocoder.engine import Code2WavEngine
from codeclog.vocoder.errors import CheckpointError, VocoderConfigError
from codeclog.vocoder.fixture import MAX_FIXTURE_BYTES, check_fixture, fixture_tensors
from codeclog.vocoder.flow import ConformerTrim, FlowConfig
from codeclog.vocoder.hift.config import HiftConfig
from codeclog.vocoder.voice import default_voice, load_voice, save_voice

pytestmark = pytest.mark.vocoder

# flow.yaml in the published structure (see tests/vocoder/data/flow.yaml) at the tiny sizes
TINY_FLOW_YAML = """\
flow: !new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec
    input_size: 32
    output_size: 80
    spk_embed_dim: 192
    output_type: 'mel'
    vocab_size: 6561
    encoder: !new:cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2
        input_size: 32
        output_size: 32
        pre_lookahead_len: 3
        num_blocks: 2
        num_up_blocks: 2
        up_stride: 2
        up_scale_factor: 2
        attention_heads: 2
        linear_units: 64
    decoder: !new:cosyvoice2.flow.flow_matching.CausalConditionalCFM
        inference_cfg_rate: 0.7
        estimator: !new:cosyvoice2.flow.decoder_dit.DiT
            in_channels: 320
            out_channels: 80
            mlp_ratio: 4.0
            depth: 2
            num_heads: 2
            head_dim: 16
            hidden_size: 32
"""


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _touch(directory: Path, *names: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_bytes(b"")
    return directory


@pytest.mark.parametrize(
    ("name", "files", "layout", "hift"),
    [
        ("1.0.5 layout", ["flow.yaml", "flow.pt", "hift.pt"], "1.0.5", "hift.pt"),
        (
            "1.0.7 layout: causal hift.pt, non-causal hift_original.pt",
            ["flow.yaml", "flow.pt", "hift.pt", "config.yaml", "hift_original.pt"],
            "1.0.7",
            "hift_original.pt",
        ),
    ],
)
def test_checkpoint_layouts(
    tmp_path: Path, name: str, files: list[str], layout: str, hift: str
) -> None:
    found = inspect_checkpoint(_touch(tmp_path / "ckpt", *files))
    assert (found.layout, found.hift_weights.name) == (layout, hift), name
    assert found.tokenizer_onnx is None and found.speaker_onnx is None


def test_onnx_prompt_models_are_detected(tmp_path: Path) -> None:
    files = ["flow.yaml", "flow.pt", "hift.pt", "campplus.onnx", "speech_tokenizer_v2_25hz.onnx"]
    found = inspect_checkpoint(_touch(tmp_path / "ckpt", *files))
    assert found.speaker_onnx is not None and found.tokenizer_onnx is not None


@pytest.mark.parametrize(
    ("name", "files", "message"),
    [
        ("no directory", None, "does not exist"),
        ("no weights", ["flow.yaml"], "lacks flow.pt, hift.pt"),
        ("no hift", ["flow.yaml", "flow.pt"], "lacks hift.pt"),
    ],
)
def test_incomplete_checkpoints_name_what_is_missing(
    tmp_path: Path, name: str, files: list[str] | None, message: str
) -> None:
    directory = tmp_path / "ckpt" if files is None else _touch(tmp_path / "ckpt", *files)
    with pytest.raises(CheckpointError, match=message):
        inspect_checkpoint(directory)


def test_weights_are_read_without_running_pickled_code(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    # any non-allow-listed global (here a date) would be constructed by a plain pickle load
    torch.save({"x": torch.zeros(1), "payload": datetime.date(2020, 1, 1)}, path)
    with pytest.raises(CheckpointError, match="cannot read weights"):
        read_torch_weights(path)
    torch.save([torch.zeros(1)], path)
    with pytest.raises(CheckpointError, match="not a flat state dict"):
        read_torch_weights(path)


def _write_checkpoint(directory: Path) -> None:
    """A checkpoint of the tiny sizes in the published format (prefixed hift keys)."""
    tensors = fixture_tensors(FlowConfig.tiny(), HiftConfig.tiny())
    directory.mkdir()
    (directory / "flow.yaml").write_text(TINY_FLOW_YAML)
    flow = {k.removeprefix("flow."): v for k, v in tensors.items() if k.startswith("flow.")}
    hift = {"generator." + k[5:]: v for k, v in tensors.items() if k.startswith("hift.")}
    torch.save(flow, directory / "flow.pt")
    torch.save(hift, directory / "hift.pt")


def test_checkpoint_directory_loads_strictly_and_decodes(tmp_path: Path) -> None:
    _write_checkpoint(tmp_path / "ckpt")
    layout = inspect_checkpoint(tmp_path / "ckpt")
    assert FlowConfig.from_yaml(layout.flow_yaml) == FlowConfig.tiny()
    flow, hift = load_checkpoint(layout, HiftConfig.tiny())
    engine = Code2WavEngine(flow, hift)
    [(audio, _)] = engine.decode_batch([(engine.setup(seed=1), [4218] * 3 + [1] * 25, False)])
    assert audio.shape == (20160,) and np.isfinite(audio).all()


def test_checkpoint_with_missing_keys_is_refused(tmp_path: Path) -> None:
    _write_checkpoint(tmp_path / "ckpt")
    weights = torch.load(tmp_path / "ckpt" / "hift.pt", weights_only=True)
    weights.pop(sorted(weights)[0])
    torch.save(weights, tmp_path / "ckpt" / "hift.pt")
    with pytest.raises(CheckpointError, match="does not fit the model"):
        load_checkpoint(inspect_checkpoint(tmp_path / "ckpt"), HiftConfig.tiny())


def test_from_spec_reports_a_missing_checkpoint_in_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        Code2WavEngine.from_spec(str(tmp_path / "nowhere"))


def test_committed_fixture_is_small_and_matches_its_generator() -> None:
    assert TINY_WEIGHTS.stat().st_size < MAX_FIXTURE_BYTES
    assert check_fixture(TINY_WEIGHTS, TINY_CONFIG)


def test_fixture_checksum_is_verified(tmp_path: Path) -> None:
    weights, config = tmp_path / "w.safetensors", tmp_path / "c.json"
    shutil.copy(TINY_WEIGHTS, weights)
    shutil.copy(TINY_CONFIG, config)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        load_fixture(weights, config)
    with pytest.raises(CheckpointError, match=r"vocoder\.fixture --write"):
        load_fixture(tmp_path / "absent.safetensors", config)


def test_manifest_and_flow_config_round_trip() -> None:
    config = dataclasses.replace(FlowConfig.tiny(), conformer_trim=ConformerTrim.PACKED)
    assert flow_config_from_dict(flow_config_to_dict(config)) == config
    manifest = FixtureManifest(config, HiftConfig.tiny(), "ab" * 32, 7, "2.x")
    assert FixtureManifest.from_json(manifest.to_json(), "m.json") == manifest
    with pytest.raises(CheckpointError, match="unknown keys: shiny"):
        flow_config_from_dict({**flow_config_to_dict(config), "shiny": 1})


def test_voice_file_round_trip(tmp_path: Path) -> None:
    voice = default_voice(FlowConfig.tiny(), prompt_tokens=6)
    save_voice(voice, tmp_path / "v.safetensors")
    loaded = load_voice(tmp_path / "v.safetensors")
    assert loaded.voice_id == voice.voice_id
    assert loaded.fingerprint == voice.fingerprint
    with pytest.raises(VocoderConfigError, match="not a codeclog voice file"):
        load_voice(TINY_WEIGHTS)


def test_default_voice_is_deterministic_and_leaves_the_global_rng_alone() -> None:
    before = torch.random.get_rng_state()
    first, second = default_voice(FlowConfig.tiny()), default_voice(FlowConfig.full())
    assert torch.equal(before, torch.random.get_rng_state())
    assert first.fingerprint == second.fingerprint  # same interface sizes, same features
    assert first.prompt_mel.shape == (100, 80) and first.spk_embedding.shape == (192,)
