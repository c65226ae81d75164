"""Every input record with what the fold did to it: the marks of the report's timeline.
How: docs/report.md, "What each section shows"."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from codeclog.consumers.stream.fold.outcomes import Outcome, OutcomeKind, Reject
from codeclog.consumers.stream.fold.report import ReportBuilder
from codeclog.consumers.stream.fold.rules import Event
from codeclog.consumers.stream.fold.state import Policy
from codeclog.consumers.stream.pipeline import AudioPipeline
from codeclog.kafka.records import InputRecord, Position
from codeclog.replay.capture_format import CapturedRecord
from codeclog.replay.inputs import InputKind, ReplayInput
from codeclog.replay.runner import ReplayOptions, pipeline_config, stream_limit_of
from codeclog.schemas.records import CodecChunk, ControlEvent, DeadLetter

NO_ID = "<no id>"  # the row of records without a request id

# A record's mark is coloured by the most telling thing it caused, in this order.
REJECTED = "rejected"
MARK_KINDS: tuple[str, ...] = (
    REJECTED,
    "gap",
    "abandoned",
    "duplicate",
    "held",
    "decoded",
    "marker",
    "released",
    "unprocessed",  # strict: arrived after the fatal rejection, never looked at
    "no effect",
)
_KIND_NAMES = {
    OutcomeKind.REJECT: REJECTED,
    OutcomeKind.GAP: "gap",
    OutcomeKind.ABANDONED: "abandoned",
    OutcomeKind.DUPLICATE: "duplicate",
    OutcomeKind.HOLD: "held",
    OutcomeKind.DECODE: "decoded",
    OutcomeKind.MARKER: "marker",
    OutcomeKind.RELEASE: "released",
}
CLEAN_KINDS = frozenset({"decoded", "marker", "released"})  # everything else is listed


@dataclasses.dataclass(frozen=True, slots=True)
class Issue:
    """One non-clean outcome (or pre-fold dead letter) and the record that caused it."""

    request_id: str  # the outcome's request (an eviction names the evicted one)
    kind: str  # a MARK_KINDS name
    reason: str  # the rejection reason; "" for other kinds
    cache_epoch: int | None
    chunk_seq: int | None
    details: Mapping[str, Any]  # the outcome's report keys besides kind/reason/position


@dataclasses.dataclass(frozen=True, slots=True)
class Mark:
    """One input record on the timeline."""

    index: int  # position in the input (log order: per partition by offset)
    request_id: str
    topic: str
    partition: int
    offset: int
    cache_epoch: int | None  # None: not a codec chunk (control event, undecodable record)
    chunk_seq: int | None
    frames: int | None
    flags: tuple[str, ...]  # last_chunk, tts_is_last_chunk, turn_end, segment_end; control kind
    kind: str  # the colour: a MARK_KINDS name
    outcomes: tuple[dict[str, Any], ...]  # every outcome it caused, as in the report (+ request)
    issues: tuple[Issue, ...]


@dataclasses.dataclass(frozen=True)
class Timeline:
    policy: Policy
    marks: tuple[Mark, ...]
    fatal: Reject | None  # strict: the rejection that stopped the stage
    fatal_index: int | None  # the mark that carried it
    outcome_records: Mapping[str, tuple[int, ...]]  # request -> mark of each report outcome

    def record_of_outcome(self, request_id: str, outcome_index: int) -> int | None:
        """The mark whose record caused the request's outcome number `outcome_index`."""
        marks = self.outcome_records.get(request_id, ())
        return marks[outcome_index] if 0 <= outcome_index < len(marks) else None


class _LastEvent(ReportBuilder):
    """The pipeline's report builder (passed to it), remembering the event it was last given."""

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.event: Event | None = None
        self.outcomes: list[Outcome] = []

    def add(self, event: Event, outcomes: Sequence[Outcome]) -> None:
        super().add(event, outcomes)
        self.event, self.outcomes = event, list(outcomes)


def build_timeline(source: ReplayInput, policy: Policy) -> Timeline:
    """Fold the input record by record under `policy` and mark every record."""
    options = ReplayOptions(policy)
    config = pipeline_config(options, stream_limit_of(source, options, None))
    builder = _LastEvent(policy)
    pipeline = AudioPipeline(config, None, lambda: 0, report_builder=builder)
    marks: list[Mark] = []
    outcome_records: dict[str, list[int]] = {}
    fatal_index = None
    for index, record, event in _records(source):
        builder.event, builder.outcomes = None, []
        was_fatal = builder.fatal is not None
        step = pipeline.step([record]) if event is None else pipeline.step_events([event])
        folded = builder.event  # None: refused before the fold
        for outcome in builder.outcomes:
            outcome_records.setdefault(outcome.request_id, []).append(index)
        if builder.fatal is not None and not was_fatal:
            fatal_index = index
        marks.append(_mark(index, record, folded, builder.outcomes, step.dead_letters, was_fatal))
    return Timeline(
        policy,
        tuple(marks),
        builder.fatal,
        fatal_index,
        {rid: tuple(indices) for rid, indices in outcome_records.items()},
    )


def _scenario(source: ReplayInput) -> bool:
    return source.kind is InputKind.SCENARIO


def _records(source: ReplayInput) -> Iterator[tuple[int, InputRecord, Event | None]]:
    """(index, the record as the pipeline takes it, the scenario event or None)."""
    if _scenario(source):
        for index, event in enumerate(source.events):
            yield index, InputRecord(Position("", 0, index), event.request_id.encode(), b""), event
        return
    for index, captured in enumerate(source.records):
        yield index, input_record(captured), None


def input_record(captured: CapturedRecord) -> InputRecord:
    """A captured record as the pipeline consumes it (a tombstone's value is empty)."""
    position = Position(captured.topic, captured.partition, captured.offset, captured.timestamp_ms)
    return InputRecord(position, captured.key, b"" if captured.value is None else captured.value)


def _mark(
    index: int,
    record: InputRecord,
    event: Event | None,
    outcomes: Sequence[Outcome],
    letters: Sequence[DeadLetter],
    after_fatal: bool,
) -> Mark:
    request_id = _request_of(record, event, letters)
    own = [o for o in outcomes if o.request_id == request_id]
    issues = [_issue(o) for o in outcomes if _KIND_NAMES[o.kind] not in CLEAN_KINDS]
    if event is None:  # refused before the fold: its dead letters are its only outcomes
        issues = [_letter_issue(letter) for letter in letters]
    position = record.position
    return Mark(
        index=index,
        request_id=request_id,
        topic=position.topic,
        partition=position.partition,
        offset=position.offset,
        cache_epoch=event.cache_epoch if isinstance(event, CodecChunk) else None,
        chunk_seq=event.chunk_seq if isinstance(event, CodecChunk) else None,
        frames=event.frames if isinstance(event, CodecChunk) else None,
        flags=_flags(event),
        kind=_kind(own, event, after_fatal, bool(letters)),
        outcomes=tuple({"request_id": o.request_id, **o.to_report()} for o in outcomes),
        issues=tuple(issues),
    )


def _request_of(record: InputRecord, event: Event | None, letters: Sequence[DeadLetter]) -> str:
    """The row of a record: its event's request; for a record refused before the fold, its
    key (the stream it sits in on the log), else the request its dead letter names."""
    if event is not None:
        return event.request_id or NO_ID
    if record.key:
        return record.key.decode("utf-8", "backslashreplace")
    return next((letter.request_id for letter in letters if letter.request_id), None) or NO_ID


def _flags(event: Event | None) -> tuple[str, ...]:
    if isinstance(event, ControlEvent):
        return (f"control:{event.kind.value}",)
    if not isinstance(event, CodecChunk):
        return ()
    names = ("last_chunk", "tts_is_last_chunk", "turn_end", "segment_end")
    return tuple(name for name in names if getattr(event, name))


def _kind(own: Sequence[Outcome], event: Event | None, after_fatal: bool, refused: bool) -> str:
    if event is None:
        return REJECTED if refused else "no effect"
    if after_fatal:
        return "unprocessed"
    names = {_KIND_NAMES[o.kind] for o in own}
    return next((kind for kind in MARK_KINDS if kind in names), "no effect")


def _issue(outcome: Outcome) -> Issue:
    report = outcome.to_report()
    return Issue(
        request_id=outcome.request_id or NO_ID,
        kind=_KIND_NAMES[outcome.kind],
        reason=str(report.get("reason", "")),
        cache_epoch=report.get("cache_epoch"),
        chunk_seq=report.get("chunk_seq"),
        details=report["details"] if "details" in report else _rest(report),
    )


def _rest(report: Mapping[str, Any]) -> dict[str, Any]:
    """An outcome's report keys besides the ones the table has columns for."""
    return {k: v for k, v in report.items() if k not in ("kind", "cache_epoch", "chunk_seq")}


def _letter_issue(letter: DeadLetter) -> Issue:
    return Issue(
        request_id=letter.request_id or NO_ID,
        kind=REJECTED,
        reason=letter.reason,
        cache_epoch=letter.cache_epoch,
        chunk_seq=letter.chunk_seq,
        details=json.loads(letter.details_json),
    )
