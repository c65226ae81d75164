"""The causal HiFT's own contract (no reference package needed): the sample-count rule, chunk
invariance, row independence, refusals, configuration and checkpoint selection.

Chunk invariance: call boundaries on multiples of the 16-frame internal block give bit-identical
audio (the same convolutions run); any other chunking differs by float rounding only, measured
5.4e-6 at most (tiny, seed 0, chunkings [7, 40, 43] and [1, 2, 3, 84] of 90 frames), so the
property allows INVARIANCE_ATOL = 1e-4 (audio is in +-0.99).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codeclog.vocoder.checkpoint import (
    HiftVariant,
    choose_hift_variant,
    inspect_checkpoint,
    load_causal_hift,
)
from codeclog.vocoder.errors import CheckpointError, VocoderConfigError, VocoderInputError
from codeclog.vocoder.hift.causal import CausalHiftConfig, build_causal_hift, initialise_causal_hift
from codeclog.vocoder.hift.causal_stream import CausalVocoder, emitted_samples
from codeclog.vocoder.hift.config import HiftConfig

pytestmark = pytest.mark.vocoder
INVARIANCE_ATOL = 1e-4
HOP = 480
LEAD_IN = 8 * HOP


@pytest.fixture(scope="module")
def vocoder() -> CausalVocoder:
    model = build_causal_hift(CausalHiftConfig.tiny())
    initialise_causal_hift(model, 0)
    return CausalVocoder(model)


def _mel(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 80, frames, generator=torch.Generator().manual_seed(seed)) - 5.0


def _stream(vocoder: CausalVocoder, mel: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    caches, out, start = [vocoder.empty_cache()], [], 0
    for index, size in enumerate(sizes):
        step = vocoder.step(caches, mel[:, :, start : start + size], index == len(sizes) - 1)
        caches, start = step.caches, start + size
        out.append(step.audio[0])
    return out


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sizes=st.lists(st.integers(0, 60), min_size=1, max_size=4))
def test_every_call_emits_what_the_sample_count_rule_says(
    vocoder: CausalVocoder, sizes: list[int]
) -> None:
    """Per call: newly available frames x 480 (received - 8 unless final), plus the 3840-sample
    lead-in before the first audio of a non-final call; per stream: frames x 480 (+ lead-in)."""
    with torch.inference_mode():
        out = _stream(vocoder, _mel(sum(sizes)), sizes)
    counts = [int(a.shape[0]) for a in out]
    assert counts == emitted_samples(sizes)
    lead = LEAD_IN if any(emitted_samples(sizes)[:-1]) else 0
    assert sum(counts) == sum(sizes) * HOP + lead


def test_canonical_windows_emit_24000_samples_and_the_final_flush_3840(
    vocoder: CausalVocoder,
) -> None:
    with torch.inference_mode():
        out = _stream(vocoder, _mel(100), [50, 50, 0])
    assert [int(a.shape[0]) for a in out] == [24000, 24000, 3840]
    assert torch.count_nonzero(out[0][:LEAD_IN]) == 0  # the lead-in is silence


@pytest.mark.parametrize(
    ("sizes", "exact"),
    [([32, 58], True), ([16, 16, 58], True), ([89, 1], True), ([7, 40, 43], False),
     ([50, 40], False), ([1, 2, 3, 84], False)],
)  # fmt: skip
def test_any_chunking_gives_the_same_audio(
    vocoder: CausalVocoder, sizes: list[int], exact: bool
) -> None:
    mel = _mel(90)
    with torch.inference_mode():
        whole = _stream(vocoder, mel, [90])[0]
        parts = torch.cat(_stream(vocoder, mel, sizes))
    audio = parts[parts.shape[0] - whole.shape[0] :]  # without the lead-in
    assert int(parts.shape[0] - whole.shape[0]) in (0, LEAD_IN)
    if exact:
        assert torch.equal(audio, whole)
    else:
        assert float((audio - whole).abs().max()) <= INVARIANCE_ATOL


def test_a_row_gets_the_same_bytes_alone_and_in_a_batch(vocoder: CausalVocoder) -> None:
    mel = torch.cat([_mel(50, seed) for seed in range(3)])
    with torch.inference_mode():
        batch = vocoder.step([vocoder.empty_cache()] * 3, mel, False)
        for row in range(3):
            alone = vocoder.step([vocoder.empty_cache()], mel[row : row + 1], False)
            assert torch.equal(batch.audio[row], alone.audio[0])


def test_refusals(vocoder: CausalVocoder) -> None:
    with torch.inference_mode():
        done = vocoder.step([vocoder.empty_cache()], _mel(10), True).caches
        with pytest.raises(VocoderInputError, match="finalized"):
            vocoder.step(done, _mel(10), False)
        with pytest.raises(VocoderInputError, match="mel must be"):
            vocoder.step([vocoder.empty_cache()] * 2, _mel(10), False)


def test_config_refuses_unknown_keys_and_other_rates() -> None:
    with pytest.raises(VocoderConfigError, match="unknown"):
        CausalHiftConfig.from_dict({"base_chanels": 16})
    with pytest.raises(VocoderConfigError, match="480"):
        CausalHiftConfig(upsample_rates=(8, 8), upsample_kernel_sizes=(16, 16),
                         source_resblock_kernel_sizes=(7, 11),
                         source_resblock_dilations=((1, 3, 5), (1, 3, 5)))  # fmt: skip
    config = CausalHiftConfig.tiny()
    assert CausalHiftConfig.from_dict(config.to_dict()) == config


def test_the_config_extends_scheme_a_s_and_sizes_the_f0_predictor_with_it() -> None:
    causal, scheme_a = CausalHiftConfig.tiny(), HiftConfig.tiny()
    assert isinstance(causal, HiftConfig)
    shared = {field.name for field in dataclasses.fields(HiftConfig)}
    assert {k: v for k, v in causal.to_dict().items() if k in shared} == scheme_a.to_dict()
    with pytest.raises(VocoderConfigError, match="must be a multiple"):  # scheme A's own check
        CausalHiftConfig(base_channels=12)
    model = build_causal_hift(dataclasses.replace(causal, f0_layers=3))
    assert sum(1 for m in model.f0_predictor.condnet if not isinstance(m, torch.nn.ELU)) == 3


def test_the_noise_table_comes_from_its_seed_not_the_global_rng() -> None:
    before = torch.random.get_rng_state()
    tables = []
    for _ in range(2):
        model = build_causal_hift(CausalHiftConfig.tiny())
        initialise_causal_hift(model, 0)
        tables.append(CausalVocoder(model).noise_table)
    assert torch.equal(before, torch.random.get_rng_state())
    assert torch.equal(tables[0], tables[1])
    assert float(tables[0].min()) >= 0.0 and float(tables[0].max()) < 1.0


def _layout(root: Path, causal: bool) -> Path:
    root.mkdir()
    names = ["flow.yaml", "flow.pt", "hift.pt"] + (
        ["config.yaml", "hift_original.pt"] if causal else []
    )
    for name in names:
        (root / name).write_bytes(b"")
    return root


def test_the_variant_is_chosen_per_checkpoint(tmp_path: Path) -> None:
    old = inspect_checkpoint(_layout(tmp_path / "old", causal=False))
    new = inspect_checkpoint(_layout(tmp_path / "new", causal=True))
    assert old.causal_hift_weights is None and new.causal_hift_weights == new.directory / "hift.pt"
    assert choose_hift_variant(new) is HiftVariant.NONCAUSAL  # today's default everywhere
    assert choose_hift_variant(new, "causal") is HiftVariant.CAUSAL
    with pytest.raises(CheckpointError, match="no causal HiFT"):
        choose_hift_variant(old, "causal")
    with pytest.raises(VocoderConfigError, match="hift variant"):
        choose_hift_variant(new, "scheme-c")


def test_load_causal_hift_is_strict(tmp_path: Path) -> None:
    config = CausalHiftConfig.tiny()
    model = build_causal_hift(config)
    initialise_causal_hift(model, 1)
    layout = inspect_checkpoint(_layout(tmp_path / "ckpt", causal=True))
    torch.save(
        {"generator." + k: v for k, v in model.state_dict().items()}, layout.directory / "hift.pt"
    )
    loaded = load_causal_hift(layout, config)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    torch.save({"conv_pre.bias": torch.zeros(3)}, layout.directory / "hift.pt")
    with pytest.raises(CheckpointError, match="does not fit"):
        load_causal_hift(layout, config)


def test_rows_with_different_plans_are_vocoded_apart_in_one_call() -> None:
    """A fresh stream and one a window in run in one batched step (batch_invariant off, the GPU
    default): their plans differ, so each is its own group and gets exactly its solo bytes."""
    model = build_causal_hift(CausalHiftConfig.tiny())
    initialise_causal_hift(model, 0)
    batched = CausalVocoder(model, batch_invariant=False)
    with torch.inference_mode():
        fresh = batched.empty_cache()
        advanced = batched.step([batched.empty_cache()], _mel(50, 1), False).caches[0]
        assert batched.plan(fresh, 50, False) != batched.plan(advanced, 50, False)
        mel = torch.cat([_mel(50, 2), _mel(50, 3)])
        both = batched.step([fresh, advanced], mel, False)
        for row, cache in enumerate((fresh, advanced)):
            alone = batched.step([cache], mel[row : row + 1], False)
            assert torch.equal(both.audio[row], alone.audio[0]), row
            assert both.caches[row].emitted == alone.caches[0].emitted
