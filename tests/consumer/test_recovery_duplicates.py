"""A chunk redelivered after a restart is recognised from the restored digests (docs/operating.md,
"How recovery works", step 2): checkpoints built by CheckpointBuilder, restored by restore_folds
into a fresh pipeline, then the redelivered record folded: `duplicate`, no decode window."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.consumers.member.progress import CheckpointBuilder
from codeclog.consumers.member.recovery import restore_folds
from codeclog.consumers.stream.pipeline import AudioPipeline, PipelineConfig, StepOutput
from codeclog.kafka.records import InputRecord, Position
from codeclog.schemas.records import StreamCheckpoint
from tests.consumer.test_pipeline_cap import record


def _pipeline() -> AudioPipeline:
    return AudioPipeline(PipelineConfig(), None, clock_ms=lambda: 0)


def _restarted(steps: Sequence[Sequence[InputRecord]]) -> AudioPipeline:
    """A member that ran `steps` and wrote their checkpoints, then a fresh one restored from
    the newest checkpoint of each request (as Recovery does on assignment)."""
    first, writer = _pipeline(), CheckpointBuilder("codec.chunks", "g", "g-0")
    newest: dict[str, StreamCheckpoint] = {}
    for records in steps:
        out = first.step(records)
        writer.note_epoch_starts(out)
        newest.update({c.request_id: c for c, _ in writer.checkpoints(first, out, now_ms=0)})
    second = _pipeline()
    restore_folds(second.fold_state(0), newest)
    return second


def _nothing_decoded(out: StepOutput) -> bool:
    return out.windows == 0 and not out.audio and not out.dead_letters


def test_a_chunk_below_the_committed_offset_is_a_duplicate_after_a_restart() -> None:
    opened = [record("a", 0, 0), record("a", 1, 1), record("a", 2, 2)]  # a stays open
    closed = [record("b", 0, 3), record("b", 1, 4, last=True)]  # b was released
    restarted = _restarted([opened, closed])
    out = restarted.step([opened[1], closed[0]])  # the same records, same offsets
    assert out.duplicates == 2 and _nothing_decoded(out)
    outcomes = restarted.report()["requests"]
    assert [o["kind"] for rid in "ab" for o in outcomes[rid]["outcomes"]] == ["duplicate"] * 2


def test_a_producer_retry_that_lands_twice_across_a_restart_is_a_duplicate() -> None:
    applied = record("a", 1, 1)
    restarted = _restarted([[record("a", 0, 0), applied]])
    copy = InputRecord(Position("codec.chunks", 0, 7), applied.key, applied.value)
    out = restarted.step([copy])  # the same content at a new offset, above the committed one
    assert out.duplicates == 1 and _nothing_decoded(out)
    out = restarted.step([record("a", 2, 8)])  # the stream goes on where it was
    assert out.windows == 1 and out.duplicates == 0


# one request per epoch 0 stream: how many chunks each sends, whether its last one is final
STREAMS = st.lists(st.tuples(st.integers(1, 6), st.booleans()), min_size=1, max_size=4)


@settings(max_examples=100, deadline=None)
@given(streams=STREAMS, where=st.floats(0, 1), picks=st.lists(st.integers(0, 99), max_size=8))
def test_any_applied_chunk_redelivered_after_any_restart_is_a_duplicate(
    streams: list[tuple[int, bool]], where: float, picks: list[int]
) -> None:
    records: list[InputRecord] = []
    for index, (chunks, final) in enumerate(streams):
        for seq in range(chunks):
            last = final and seq == chunks - 1
            records.append(record(f"r{index}", seq, len(records), last=last))
    cut = max(1, int(len(records) * where))
    restarted = _restarted([records[:cut]])
    again = [records[pick % cut] for pick in picks]
    out = restarted.step(again)
    assert out.duplicates == len(again) and _nothing_decoded(out)
