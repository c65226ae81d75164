"""The fold's window rules and the engine's must agree; a mismatch is refused at construction."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from codeclog.consumers.stream.engine import (
    EngineFacts,
    EngineMismatchError,
    check_checkpoint_fits,
    check_engine_fits,
)
from codeclog.consumers.stream.fold.state import FoldConfig
from codeclog.consumers.stream.limit import StateSizes
from codeclog.consumers.stream.pipeline import AudioPipeline, PipelineConfig
from codeclog.schemas.records import MAX_CODEC_ID


@dataclasses.dataclass
class _Calls:
    flow: int = 0
    hift: int = 0


class _Silent:
    """The engine calls, doing nothing."""

    def setup(self, voice: Any = None, seed: int = 0) -> Any:
        return None

    def decode_batch(self, items: Any) -> list[Any]:
        return []

    def release(self, state: Any) -> None:
        pass


@dataclasses.dataclass
class _Rules(_Silent):
    """An engine that states every EngineFacts member (so its rules are checked)."""

    lookahead_frames: int = 3
    vocab_size: int = MAX_CODEC_ID + 1
    domain: str = ""
    calls: _Calls = dataclasses.field(default_factory=_Calls)

    def peak_state_bytes(self) -> int:
        return 1

    def default_state_budget_bytes(self) -> int:
        return 1


def test_agreeing_rules_pass() -> None:
    AudioPipeline(PipelineConfig(), _Rules())


def test_a_lookahead_mismatch_is_refused_when_the_pipeline_is_built() -> None:
    with pytest.raises(EngineMismatchError, match=r"2 lookahead ids.*configured for 3"):
        AudioPipeline(PipelineConfig(), _Rules(lookahead_frames=2))
    with pytest.raises(EngineMismatchError, match="4 lookahead"):
        check_engine_fits(FoldConfig(lookahead_frames=3), _Rules(lookahead_frames=4))


def test_a_codec_range_mismatch_is_refused() -> None:
    with pytest.raises(EngineMismatchError, match=r"0\.\.99"):
        check_engine_fits(FoldConfig(), _Rules(vocab_size=100))


def test_the_tiny_engine_fits_the_default_fold(tiny_engine: Any) -> None:
    assert tiny_engine.lookahead_frames == FoldConfig().lookahead_frames
    check_engine_fits(FoldConfig(), tiny_engine)


def test_the_engine_states_every_fact_the_pipeline_and_the_budget_read(tiny_engine: Any) -> None:
    """Else its rules would go unchecked, its audio unstamped and its streams unbudgeted."""
    assert isinstance(tiny_engine, EngineFacts) and isinstance(tiny_engine, StateSizes)
    pipeline = AudioPipeline(PipelineConfig(), tiny_engine)
    assert pipeline.domain == tiny_engine.domain != ""


def test_an_engine_without_the_facts_is_taken_as_it_is() -> None:
    @dataclasses.dataclass
    class _Bare(_Silent):
        lookahead_frames: int = 2  # stated alone: not EngineFacts, so not checked

    assert AudioPipeline(PipelineConfig(), _Bare()).domain == ""


CAUSAL = "portable1:torch2.15:x86_64:causal"
NONCAUSAL = "portable1:torch2.15:x86_64"


@pytest.mark.parametrize(("written", "here"), [(CAUSAL, NONCAUSAL), (NONCAUSAL, CAUSAL)])
def test_a_checkpoint_of_the_other_hift_variant_is_refused(written: str, here: str) -> None:
    with pytest.raises(EngineMismatchError, match=r"request r1: .* written by a \w+ HiFT engine"):
        check_checkpoint_fits("r1", written, here)


@pytest.mark.parametrize(
    ("written", "here"),
    [
        (CAUSAL, CAUSAL),
        (NONCAUSAL, NONCAUSAL),
        (CAUSAL, "native:torch2.15:cpu:AuthenticAMD:AVX2:t1:causal"),  # other kernels: a warning
        ("", CAUSAL),  # unknown writer
        (NONCAUSAL + ":bfloat16", NONCAUSAL),  # another dtype: the cross-domain warning only
    ],
)
def test_a_checkpoint_of_the_same_variant_fits(written: str, here: str) -> None:
    check_checkpoint_fits("r1", written, here)


def test_recovery_refuses_a_causal_stream_before_decoding_anything() -> None:
    """The check runs before the epoch is read back (no cluster is touched: none exists)."""
    from codeclog.consumers.member.recovery import Recovery, RecoverySource
    from codeclog.schemas.records import StreamCheckpoint

    recovery = Recovery(RecoverySource({}, "chunks", "progress", "g", 0.1), metrics=None)  # type: ignore[arg-type]
    pipeline = AudioPipeline(PipelineConfig(), None)
    pipeline.domain = NONCAUSAL
    written = StreamCheckpoint(
        "r1", "chunks", 0, True, 0, 0, 5, 1, 24000, determinism_domain=CAUSAL
    )
    with pytest.raises(EngineMismatchError, match="run it with --hift causal"):
        recovery._rebuild(pipeline, None, {"r1": 0}, {"r1": written})  # type: ignore[arg-type]
