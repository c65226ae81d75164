"""The vocoder engine as the pipeline sees it (kept torch-free here), and the checks that it
fits the fold's window rules and a checkpoint's HiFT variant."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from codeclog.consumers.stream.fold.state import FoldConfig
from codeclog.consumers.stream.limit import StateSizes
from codeclog.errors import UsageError
from codeclog.schemas.records import MAX_CODEC_ID
from codeclog.vocoder.shared import domain_hift_variant


class VocoderEngine(Protocol):
    """What the pipeline needs from vocoder.engine.Code2WavEngine (kept torch-free here): the
    required core. What a real engine states besides is `EngineFacts`, read only where the
    engine has all of it (a test double may have none)."""

    def setup(self, voice: Any = None, seed: int = 0) -> Any: ...

    def decode_batch(
        self, items: Sequence[tuple[Any, Sequence[int], bool]]
    ) -> list[tuple[np.ndarray, Any]]: ...

    def release(self, state: Any) -> None: ...


class ModelCalls(Protocol):
    """Model calls an engine made so far (vocoder.engine.code2wav.DecodeCalls)."""

    @property
    def flow(self) -> int: ...

    @property
    def hift(self) -> int: ...


@runtime_checkable
class EngineFacts(StateSizes, Protocol):
    """The optional part of an engine, all or nothing (Code2WavEngine states every member):
    its window rules (`check_engine_fits`), the determinism domain stamped on its audio, its
    model-call counts (step metrics) and, from `StateSizes`, the sizes the open-stream budget
    charges (consumers.stream.limit). An engine without them is taken as it is: no rules
    checked, domain "", no call counts, no state budget."""

    @property
    def lookahead_frames(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def domain(self) -> str: ...

    @property
    def calls(self) -> ModelCalls: ...


class EngineMismatchError(UsageError):
    """The engine's window rules differ from the fold's: its windows would be refused or cut
    differently than the fold decided (lookahead frames or codec-id range); or a checkpoint
    was written by an engine of the other HiFT variant (check_checkpoint_fits)."""


def check_checkpoint_fits(request_id: str, written_domain: str, engine_domain: str) -> None:
    """Raise EngineMismatchError when the checkpoint's stream was decoded by a causal HiFT
    engine and this one is non-causal, or the other way round: the stream cannot continue
    here (its audio so far came from another vocoder). Unknown domains ("") are taken as
    they are."""
    if not written_domain or not engine_domain:
        return
    written, here = domain_hift_variant(written_domain), domain_hift_variant(engine_domain)
    if written != here:
        raise EngineMismatchError(
            f"request {request_id}: its checkpoint was written by a {written} HiFT engine "
            f"(domain {written_domain}); this member's engine is {here}: run it with "
            f"--hift {written}"
        )


def check_engine_fits(fold_config: FoldConfig, engine: object) -> None:
    """Raise EngineMismatchError unless the engine's lookahead and codec-id range equal the
    fold's. An engine that does not state them (not `EngineFacts`) is taken as it is."""
    if not isinstance(engine, EngineFacts):
        return
    lookahead = engine.lookahead_frames
    if lookahead != fold_config.lookahead_frames:
        raise EngineMismatchError(
            f"the vocoder's flow takes {lookahead} lookahead ids per window, the fold is "
            f"configured for {fold_config.lookahead_frames} (FoldConfig.lookahead_frames)"
        )
    vocab = engine.vocab_size
    if vocab != MAX_CODEC_ID + 1:
        raise EngineMismatchError(
            f"the vocoder accepts codec ids 0..{vocab - 1}, the wire contract 0..{MAX_CODEC_ID}"
        )


def model_calls(facts: EngineFacts | None) -> tuple[int, int]:
    """(flow, HiFT) calls the engine made so far (Code2WavEngine.calls); (0, 0) if untracked."""
    return (0, 0) if facts is None else (facts.calls.flow, facts.calls.hift)
