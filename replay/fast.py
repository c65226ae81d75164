"""State-only replay of a capture table: the pipeline's decisions without the pipeline.

Without a vocoder, what `AudioPipeline.step` does with a record is: wire-decode it (a failure
or a record that is not an event is an `undecodable_record` dead letter), check its key against
the request id (`key_mismatch`), fold it into its partition's state (one state for every
partition under strict) and add the outcomes to the report; each reject is a dead letter. The
decode windows only count, the vocoder rounds do nothing. This module does exactly that, with
the values decoded in bulk (`schemas.columnar`), so `replay.runner.replay` gives the same report
and dead-letter reasons either way (tests/replay/test_replay_fast.py runs both).
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from consumers.fold.machine import FoldConfig, FoldState, Policy, fold, new_state
from consumers.fold.outcomes import Reject, RejectReason
from consumers.fold.report import ReportBuilder
from consumers.pipeline import KEY_MISMATCH
from replay.columns import CaptureTable
from schemas.columnar import decode_spans
from schemas.records import CodecChunk, ControlEvent

UNDECODABLE = RejectReason.UNDECODABLE_RECORD.value
Progress = Callable[[int], None]  # called with the records done so far


def replay_table(
    table: CaptureTable, config: FoldConfig, step_records: int, progress: Progress | None = None
) -> tuple[dict[str, Any], Counter[str]]:
    """The pipeline's report and the dead-letter reasons of replaying `table` without audio."""
    with collector_paused():
        starts, ends, present = table.value_spans()
        events = decode_spans(table.data, table.buffer, starts, ends, present)
        return _fold_all(table, events, config, step_records, progress)


@contextmanager
def collector_paused() -> Iterator[None]:
    """The replay allocates hundreds of thousands of objects that all live to its end: the
    cyclic collector would rescan them again and again (a third of the fold's time) and free
    nothing. Reference counting still frees garbage; the collector resumes afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _fold_all(
    table: CaptureTable,
    events: Sequence[Any],
    config: FoldConfig,
    step_records: int,
    progress: Progress | None,
) -> tuple[dict[str, Any], Counter[str]]:
    builder = ReportBuilder(config.policy)
    states: dict[int, FoldState] = {}
    per_partition = config.policy is Policy.TOLERANT
    partitions = table.partitions.tolist() if per_partition else [0] * len(events)
    keys = table.keys()
    dead: Counter[str] = Counter()
    for start in range(0, len(events), step_records):
        stop = min(start + step_records, len(events))
        for index in range(start, stop):
            event = events[index]
            if type(event) is not CodecChunk and type(event) is not ControlEvent:
                dead[UNDECODABLE] += 1
                continue
            key = keys[index]
            if key is not None and key != event.request_id.encode():
                dead[KEY_MISMATCH] += 1
                continue
            state = states.get(partitions[index])
            if state is None:
                state = states[partitions[index]] = new_state(config)
            _, outcomes = fold(state, event)
            builder.add(event, outcomes)
            for outcome in outcomes:
                if type(outcome) is Reject:
                    dead[outcome.reason.value] += 1
        if progress is not None:
            progress(stop)
    return builder.result(), dead
