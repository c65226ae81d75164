"""The open-stream cap in the pipeline (rule C1a applied per input partition): what a step writes
for an eviction (the dead letter naming the evicting record, the victim's closing checkpoint,
the metric's cause), that it is a function of the input alone (any step boundaries, a restart
from the checkpoints), and how the limit is derived (consumers.stream.limit)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from codeclog.consumers.member.progress import CheckpointBuilder
from codeclog.consumers.member.recovery import restore_folds
from codeclog.consumers.stream.fold.state import FoldConfig
from codeclog.consumers.stream.limit import (
    EVICTED_BY_BUDGET,
    EVICTED_BY_CAP,
    LimitOptions,
    stream_limit,
)
from codeclog.consumers.stream.pipeline import AudioPipeline, PipelineConfig, StepOutput
from codeclog.errors import ConfigError
from codeclog.kafka.records import InputRecord, Position
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk, DeadLetter, StreamCheckpoint

TOPIC = "codec.chunks"
WORDS = (10, 11, 12, 13, 14)


def record(rid: str, seq: int, offset: int, partition: int = 0, last: bool = False) -> InputRecord:
    value = wire.encode(
        CodecChunk(request_id=rid, cache_epoch=0, chunk_seq=seq, codes=WORDS, last_chunk=last)
    )
    return InputRecord(Position(TOPIC, partition, offset), rid.encode(), value)


def pipeline(cap: int | None, cause: str = EVICTED_BY_CAP) -> AudioPipeline:
    config = PipelineConfig(fold=FoldConfig(max_open_streams=cap), eviction_cause=cause)
    return AudioPipeline(config, None, clock_ms=lambda: 0)


def evicted(letters: Sequence[DeadLetter]) -> list[DeadLetter]:
    return [d for d in letters if d.reason == "evicted"]


def test_an_eviction_is_written_with_the_record_that_caused_it() -> None:
    p = pipeline(2)
    out = p.step([record("a", 0, 10), record("b", 0, 11), record("c", 0, 12)])
    [letter] = evicted(out.dead_letters)
    assert letter.request_id == "a"
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (TOPIC, 0, 12)
    assert json.loads(letter.details_json)["evicted_by"] == "c"
    assert out.evictions == {EVICTED_BY_CAP: 1}
    assert out.touched["a"] == 0  # so the step writes a's closing checkpoint


def test_the_victims_closing_checkpoint_is_written_in_the_same_step() -> None:
    p = pipeline(1)
    writer = CheckpointBuilder(TOPIC, "g", "g-0")
    writer.note_epoch_starts(p.step([record("a", 0, 0)]))
    out = p.step([record("b", 0, 1)])
    writer.note_epoch_starts(out)
    checkpoints = {c.request_id: c for c, _ in writer.checkpoints(p, out, now_ms=0)}
    assert checkpoints["a"].open is False and checkpoints["a"].epoch_start_offset == -1
    assert json.loads(checkpoints["a"].fold_state_json)["released"][-1]["end"] == "evicted"
    assert checkpoints["b"].open is True and checkpoints["b"].last_offset == 1


def test_the_cause_is_the_bound_that_set_the_limit() -> None:
    out = pipeline(1, EVICTED_BY_BUDGET).step([record("a", 0, 0), record("b", 0, 1)])
    assert out.evictions == {EVICTED_BY_BUDGET: 1}


def test_partitions_are_capped_each_on_its_own() -> None:
    p = pipeline(1)
    out = p.step([record("a", 0, 0, partition=0), record("b", 0, 0, partition=1)])
    assert evicted(out.dead_letters) == [] and p.open_streams() == 2


def test_an_idle_stream_goes_before_one_speaking_in_the_same_step() -> None:
    p = pipeline(2)
    p.step([record("idle", 0, 0)])
    out = p.step([record("live", 0, 1), record("live", 1, 2), record("new", 0, 3)])
    assert [d.request_id for d in evicted(out.dead_letters)] == ["idle"]


# --- a function of the input alone ------------------------------------------------------------


def traffic(raw: Sequence[tuple[int, bool]]) -> list[InputRecord]:
    """One partition's records: (request, final) steps, each request counting its seqs."""
    seqs: dict[str, int] = {}
    records = []
    for offset, (index, last) in enumerate(raw):
        rid = f"r{index}"
        seq = seqs.get(rid, 0)
        records.append(record(rid, seq, offset, last=last))
        seqs[rid] = seq + 1
    return records


def dead_letters_of(outs: Sequence[StepOutput]) -> list[tuple[str | None, int, str, bool]]:
    """(request, source offset, reason, an eviction rather than a late chunk) of each."""
    return [
        (d.request_id, d.source_offset, d.reason, "evicted_by" in d.details_json)
        for o in outs
        for d in o.dead_letters
    ]


@settings(max_examples=150, deadline=None)
@given(
    raw=st.lists(st.tuples(st.integers(0, 5), st.sampled_from([False] * 5 + [True])), max_size=60),
    cap=st.integers(1, 4),
    step=st.integers(1, 8),
    where=st.floats(0, 1),
)
@example(raw=[(0, False), (1, False), (0, False), (2, False)], cap=2, step=1, where=0.75)
def test_a_restarted_member_evicts_what_an_uninterrupted_one_does(
    raw: list[tuple[int, bool]], cap: int, step: int, where: float
) -> None:
    """Steps of any size; a restart at any step boundary restores the fold from the newest
    checkpoint of each request, as recovery does. Every request is evicted at most once per
    epoch, and the dead letters are those of one uninterrupted pass in one step."""
    records = traffic(raw)
    whole = pipeline(cap)
    expected = dead_letters_of([whole.step(records)])

    cut = int(len(records) * where)
    cut -= cut % step
    first, writer = pipeline(cap), CheckpointBuilder(TOPIC, "g", "g-0")
    newest: dict[str, StreamCheckpoint] = {}
    outs = []
    for start in range(0, cut, step):
        out = first.step(records[start : min(start + step, cut)])
        writer.note_epoch_starts(out)
        newest.update({c.request_id: c for c, _ in writer.checkpoints(first, out, now_ms=0)})
        outs.append(out)
    second = pipeline(cap)
    restore_folds(second.fold_state(0), newest)
    for start in range(cut, len(records), step):
        outs.append(second.step(records[start : start + step]))
    assert dead_letters_of(outs) == expected
    victims = [rid for rid, _, _, eviction in expected if eviction]
    assert len(set(victims)) == len(victims)  # one epoch per request here: evicted once


# --- the limit --------------------------------------------------------------------------------


def test_the_group_cap_is_split_across_partitions() -> None:
    limit = stream_limit(1024, 8)
    assert (limit.per_partition, limit.cause) == (128, EVICTED_BY_CAP)
    assert stream_limit(5, 8).per_partition == 1  # at least one


def test_the_budget_decides_when_it_holds_fewer() -> None:
    limit = stream_limit(1024, 8, budget_bytes=8_000, stream_bytes=100)
    assert (limit.per_partition, limit.cause) == (10, EVICTED_BY_BUDGET)
    assert stream_limit(16, 8, budget_bytes=8_000, stream_bytes=100).cause == EVICTED_BY_CAP
    assert stream_limit(1024, 8, budget_bytes=8_000, stream_bytes=0).cause == EVICTED_BY_CAP


def test_a_budget_below_one_stream_per_partition_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match="fewer than one per partition"):
        stream_limit(1024, 8, budget_bytes=700, stream_bytes=100)


def test_options_resolve_the_engines_budget_only_with_an_engine() -> None:
    class Sized:
        def peak_state_bytes(self) -> int:
            return 100

        def default_state_budget_bytes(self) -> int:
            return 1_600

    assert LimitOptions(64).resolve(8, None).per_partition == 8
    assert LimitOptions(64).resolve(8, Sized()).per_partition == 2  # 16 streams over 8
    assert LimitOptions(64, state_budget_mb=0.0032).resolve(8, Sized()).per_partition == 4
