"""The fold's window rules and the engine's must agree; a mismatch is refused at construction."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from codeclog.consumers.fold.machine import FoldConfig
from codeclog.consumers.pipeline import (
    AudioPipeline,
    EngineMismatchError,
    PipelineConfig,
    check_engine_fits,
)
from codeclog.schemas.records import MAX_CODEC_ID


@dataclasses.dataclass
class _Rules:
    lookahead_frames: int = 3
    vocab_size: int = MAX_CODEC_ID + 1

    def setup(self, voice: Any = None, seed: int = 0) -> Any:
        return None

    def decode_batch(self, items: Any) -> list[Any]:
        return []

    def release(self, state: Any) -> None:
        pass


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
