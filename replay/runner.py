"""Replay a capture or a scenario offline: the same fold (and vocoder) as the live consumer.
Determinism: docs/replay.md, "Replay"."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from codeclog.consumers.stream.fold.state import FoldConfig, Policy
from codeclog.consumers.stream.limit import EVICTED_BY_CAP, LimitOptions, StreamLimit
from codeclog.consumers.stream.pipeline import AudioPipeline, PipelineConfig, StepOutput
from codeclog.errors import CodeclogError
from codeclog.kafka.records import InputRecord, Position
from codeclog.replay.columns import CaptureTable
from codeclog.replay.errors import VocoderSpecError
from codeclog.replay.fast import replay_table
from codeclog.replay.inputs import InputKind, ReplayInput
from codeclog.replay.jsontext import dumps_sorted_indent1

STEP_RECORDS = 256  # records per pipeline step; fixed so batches are the same in every run
VOCODER_NONE = "none"
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class ReplayOptions:
    policy: Policy = Policy.TOLERANT
    vocoder: str = VOCODER_NONE  # "none", "tiny" or a checkpoint directory
    step_records: int = STEP_RECORDS
    keep_pcm: bool = False  # collect every request's PCM (for --wav-dir)
    workers: int | None = None  # processes for a state-only tolerant replay (None: per core)
    kernels: str = "portable"  # vocoder kernels: portable (same bytes on any CPU) or native
    hift: str = "noncausal"  # the HiFT variant: noncausal (scheme A) or causal (scheme B)
    dtype: str = "float32"  # the flow's dtype (float32 or bfloat16 on the CPU)
    # the members' open-stream options: a tolerant replay evicts as they did (rule C1a)
    limits: LimitOptions = dataclasses.field(default_factory=LimitOptions)


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    report: dict[str, Any]
    pcm_by_request: dict[str, bytes]  # request -> 16-bit PCM; empty unless keep_pcm and vocoding


class StepProgress(Protocol):
    def update(self, done: int, total: int, written: int) -> None: ...

    def close(self) -> None: ...


def report_json(report: dict[str, Any]) -> str:
    """The --json form: sorted keys, so equal reports are equal bytes. Exactly
    `json.dumps(report, sort_keys=True, indent=1, ensure_ascii=False)`, written faster."""
    return dumps_sorted_indent1(report) + "\n"


def chunked(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def replay(
    source: ReplayInput, options: ReplayOptions, progress: StepProgress | None = None
) -> ReplayResult:
    """Run the input through the shared pipeline (consumers.stream.pipeline) and build the report.

    A capture read as columns, replayed without a vocoder, takes the state-only path
    (replay.fast): the same decisions as the pipeline, with the values decoded in bulk."""
    if source.table is not None and options.vocoder == VOCODER_NONE:
        return _replay_state_only(source, source.table, options, progress)
    engine = load_engine(options.vocoder, options.kernels, options.hift, options.dtype)
    limit = stream_limit_of(source, options, engine)
    pipeline = AudioPipeline(pipeline_config(options, limit), engine, _no_clock)
    items: Sequence[Any] = source.records if source.kind is InputKind.CAPTURE else source.events
    step = _record_step(pipeline) if source.kind is InputKind.CAPTURE else pipeline.step_events
    dead_letters: Counter[str] = Counter()
    done = 0
    for batch in chunked(items, options.step_records):
        output = step(batch)
        dead_letters.update(letter.reason for letter in output.dead_letters)
        done += len(batch)
        if progress is not None:
            progress.update(done, len(items), done)
    if progress is not None:
        progress.close()
    report = _finish_report(pipeline.report(), source, options, dead_letters, limit)
    if engine is not None:
        report["determinism_domain"] = pipeline.domain  # what decided the audio bytes
    return ReplayResult(report, _pcm_by_request(pipeline))


def _replay_state_only(
    source: ReplayInput, table: CaptureTable, options: ReplayOptions, progress: StepProgress | None
) -> ReplayResult:
    total = len(table)

    def update(done: int) -> None:
        if progress is not None:
            progress.update(done, total, done)

    limit = stream_limit_of(source, options, None)
    config = pipeline_config(options, limit).fold
    report, dead_letters = replay_table(
        table, config, options.step_records, update, options.workers
    )
    if progress is not None:
        progress.close()
    return ReplayResult(_finish_report(report, source, options, dead_letters, limit), {})


def stream_limit_of(
    source: ReplayInput, options: ReplayOptions, engine: object | None
) -> StreamLimit | None:
    """The members' open-stream limit over the input's partitions (a capture's topic had
    `partition_count`; a scenario is one partition). None under strict: the upstream stage it
    mirrors has no cap."""
    if options.policy is not Policy.TOLERANT:
        return None
    partitions = source.metadata.partition_count if source.metadata is not None else 1
    return options.limits.resolve(max(1, partitions), engine)


def pipeline_config(options: ReplayOptions, limit: StreamLimit | None = None) -> PipelineConfig:
    """Strict runs ONE fold state, as the upstream stage is one process: its first rejection
    stops every partition. Tolerant runs one per partition, exactly like the live consumer,
    and evicts beyond `limit` as it does."""
    vocoding = options.vocoder != VOCODER_NONE
    cap = None if limit is None else limit.per_partition
    return PipelineConfig(
        fold=FoldConfig(policy=options.policy, max_open_streams=cap),
        per_partition=options.policy is Policy.TOLERANT,
        keep_pcm=options.keep_pcm and vocoding,
        record_audio=vocoding,
        producer_id="replay",
        eviction_cause=EVICTED_BY_CAP if limit is None else limit.cause,
    )


def _no_clock() -> int:
    # Dead letters carry a timestamp; a replay has no "now", and its output must not vary.
    return 0


def _record_step(pipeline: AudioPipeline) -> Callable[[Sequence[Any]], StepOutput]:
    def step(records: Sequence[Any]) -> StepOutput:
        inputs = [
            InputRecord(
                Position(r.topic, r.partition, r.offset, r.timestamp_ms),
                r.key,
                b"" if r.value is None else r.value,
            )
            for r in records
        ]
        return pipeline.step(inputs)

    return step


def _pcm_by_request(pipeline: AudioPipeline) -> dict[str, bytes]:
    return {rid: bytes(audio.pcm) for rid, audio in sorted(pipeline.audio.items()) if audio.pcm}


def load_engine(
    spec: str, kernels: str = "portable", hift: str = "noncausal", dtype: str = "float32"
) -> Any:
    """The vocoder for --vocoder (None for "none"), with `kernels` (portable by default: the
    same audio bytes on every x86-64 CPU), the HiFT variant and the flow's dtype. torch is
    imported only here."""
    if spec == VOCODER_NONE:
        return None
    try:
        from codeclog.vocoder.engine import Code2WavEngine
    except ImportError as exc:
        raise VocoderSpecError(
            f"--vocoder {spec} needs the vocoder extra (torch): pip install 'codeclog[vocoder]' "
            f"({exc.name} is missing)"
        ) from exc
    try:
        return Code2WavEngine.from_spec(spec, kernels=kernels, hift=hift, dtype=dtype)
    except (OSError, ValueError, CodeclogError) as exc:
        raise VocoderSpecError(f"cannot load the vocoder {spec!r}: {exc}") from exc


def _finish_report(
    report: dict[str, Any],
    source: ReplayInput,
    options: ReplayOptions,
    dead_letters: Counter[str],
    limit: StreamLimit | None,
) -> dict[str, Any]:
    """The pipeline's report plus where it came from (only facts taken from the input)."""
    out = dict(report)
    out["stream_limit"] = "none (strict)" if limit is None else limit.describe()
    out["input"] = source.describe()
    out["vocoder"] = options.vocoder
    out["dead_letters"] = {
        "total": sum(dead_letters.values()),
        "by_reason": dict(sorted(dead_letters.items())),
    }
    if source.metadata is not None:
        out["provenance"] = source.metadata.provenance()
    return out
