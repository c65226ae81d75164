"""The open-stream memory budget: its rule (consumers.state_budget) and the pipeline applying it
with the tiny vocoder and a budget of a few streams."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.consumers.pipeline import (
    EVICTED_BY_BUDGET,
    AudioPipeline,
    InputRecord,
    PipelineConfig,
    Position,
)
from codeclog.consumers.state_budget import StateBudget
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk

SILENCE = (4218, 4218, 4218)


def test_unbounded_admits_everything() -> None:
    budget = StateBudget(None, 10)
    for rid in "abcdef":
        assert budget.admit(rid, busy=()).admitted
        budget.add(rid)
    assert budget.charged_bytes == 60 and not budget.over_budget()


def test_the_least_recently_used_idle_stream_goes_first() -> None:
    budget = StateBudget(25, 10)
    budget.add("a")
    budget.add("b")
    budget.touch("a")  # b is now the least recently used
    admission = budget.admit("c", busy=())
    assert admission.admitted and admission.evict == ("b",)
    admission = budget.admit("c", busy={"b"})  # b decodes in this round: a goes instead
    assert admission.admitted and admission.evict == ("a",)


def test_a_stream_that_cannot_fit_is_refused_and_nothing_is_evicted() -> None:
    budget = StateBudget(25, 10)
    budget.add("a")
    budget.add("b")
    assert budget.admit("c", busy={"a", "b"}).evict == ()
    assert not budget.admit("c", busy={"a", "b"}).admitted
    assert not StateBudget(5, 10).admit("a", busy=()).admitted  # one stream exceeds it alone


def test_a_new_epoch_of_an_open_request_reuses_its_own_charge() -> None:
    budget = StateBudget(10, 10)
    budget.add("a")
    assert budget.admit("a", busy={"a"}).admitted


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "touch", "release"]),
        st.integers(0, 7),
        st.sets(st.integers(0, 7), max_size=4),
    ),
    max_size=60,
)


@settings(max_examples=80, deadline=None)
@given(limit=st.integers(0, 60), size=st.integers(1, 20), ops=_OPS)
def test_the_budget_is_never_exceeded_and_victims_are_idle_lru(
    limit: int, size: int, ops: list[tuple[str, int, set[int]]]
) -> None:
    budget = StateBudget(limit, size)
    order: list[str] = []  # independent model: least recently used first
    for op, n, busy_ids in ops:
        rid, busy = f"r{n}", {f"r{b}" for b in busy_ids} & set(order)
        if op == "admit":
            admission = budget.admit(rid, busy)
            pinned = len([r for r in order if r in busy and r != rid])
            assert admission.admitted == (limit - size * pinned >= size)
            if admission.admitted:
                expected = [r for r in order if r != rid and r not in busy]
                assert list(admission.evict) == expected[: len(admission.evict)]
                for victim in admission.evict:
                    budget.release(victim)
                    order.remove(victim)
                budget.add(rid)
                if rid in order:
                    order.remove(rid)
                order.append(rid)
            else:
                assert admission.evict == ()
        elif op == "touch":
            budget.touch(rid)
            if rid in order:
                order.remove(rid)
                order.append(rid)
        else:
            budget.release(rid)
            if rid in order:
                order.remove(rid)
        assert budget.charged_bytes == size * len(order) <= max(limit, 0)


# -- the pipeline with the tiny vocoder ----------------------------------------------------------


def _window(rid: str, seq: int, last: bool = False) -> CodecChunk:
    start = 100 + 25 * seq
    codes = SILENCE + tuple(range(100, 125)) if seq == 0 else tuple(range(start - 3, start + 25))
    return CodecChunk(rid, codes, 0, seq, 28, 25, 3, last_chunk=last)


def _records(chunks: Sequence[CodecChunk], start: int) -> list[InputRecord]:
    return [
        InputRecord(Position("chunks", 0, start + i), c.request_id.encode(), wire.encode(c))
        for i, c in enumerate(chunks)
    ]


def _pipeline(engine: Any, streams: float) -> AudioPipeline:
    budget = int(streams * engine.peak_state_bytes())
    return AudioPipeline(PipelineConfig(state_budget_bytes=budget), engine, clock_ms=lambda: 0)


def test_a_new_stream_evicts_the_least_recently_used(tiny_engine: Any) -> None:
    pipeline = _pipeline(tiny_engine, 2.5)  # room for two streams
    first = pipeline.step(_records([_window("a", 0), _window("b", 0)], 0))
    assert {c.request_id for c in first.audio} == {"a", "b"} and not first.dead_letters
    again = pipeline.step(_records([_window("a", 1)], 2))  # b is now the least recently used
    assert [c.request_id for c in again.audio] == ["a"]
    out = pipeline.step(_records([_window("c", 0)], 3))
    assert [c.request_id for c in out.audio] == ["c"]
    assert [(d.request_id, d.reason) for d in out.dead_letters] == [("b", "evicted")]
    assert "state budget" in out.dead_letters[0].error
    assert out.evictions == {EVICTED_BY_BUDGET: 1}
    assert pipeline.budget.streams == 2
    assert pipeline.budget.charged_bytes <= pipeline.budget.limit_bytes  # type: ignore[operator]
    late = pipeline.step(_records([_window("b", 1), _window("a", 2, last=True)], 4))
    assert [c.request_id for c in late.audio] == ["a"]  # a goes on; b's stream is gone
    assert [(d.request_id, d.reason) for d in late.dead_letters] == [("b", "evicted")]
    assert pipeline.budget.streams == 1  # a ended: its charge is released


def test_a_stream_that_cannot_fit_in_its_round_is_refused(tiny_engine: Any) -> None:
    pipeline = _pipeline(tiny_engine, 1.5)  # room for one stream
    out = pipeline.step(_records([_window("a", 0), _window("b", 0), _window("b", 1)], 0))
    assert [c.request_id for c in out.audio] == ["a"]
    assert [(d.request_id, d.reason) for d in out.dead_letters] == [("b", "evicted")]
    assert out.evictions == {EVICTED_BY_BUDGET: 1}
    assert pipeline.budget.streams == 1


def test_without_a_budget_nothing_is_evicted(tiny_engine: Any) -> None:
    pipeline = AudioPipeline(PipelineConfig(), tiny_engine, clock_ms=lambda: 0)
    out = pipeline.step(_records([_window(r, 0) for r in "abcd"], 0))
    assert len(out.audio) == 4 and not out.dead_letters and out.evictions == {}
    # the step's model calls (the metric): exact batching, equal shapes, HiFT per row on CPU
    slices = min(4, tiny_engine.workers)
    assert (out.decode_calls, out.flow_calls, out.hift_calls) == (1, slices, 4)


# -- the pipeline with a stand-in engine: the bound holds for any interleaving -------------------


@dataclasses.dataclass(frozen=True)
class _Counter:
    windows: int


class _SizedEngine:
    def peak_state_bytes(self) -> int:
        return 100

    def setup(self, voice: Any = None, seed: int = 0) -> _Counter:
        return _Counter(0)

    def decode_batch(self, items: Sequence[tuple[Any, Sequence[int], bool]]) -> list[Any]:
        return [(np.zeros(4, np.float32), _Counter(s.windows + 1)) for s, _, _ in items]

    def release(self, state: Any) -> None:
        pass


@settings(max_examples=40, deadline=None)
@given(
    streams=st.integers(1, 4),
    schedule=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 3)), min_size=1, max_size=25),
)
def test_the_pipeline_never_holds_more_than_its_budget(
    streams: int, schedule: list[tuple[int, int]]
) -> None:
    pipeline = AudioPipeline(
        PipelineConfig(state_budget_bytes=streams * 100), _SizedEngine(), clock_ms=lambda: 0
    )
    seqs: dict[str, int] = {}
    offset = 0
    for request, count in schedule:
        rid = f"r{request}"
        chunks = []
        for _ in range(count):
            chunks.append(_window(rid, seqs.get(rid, 0)))
            seqs[rid] = seqs.get(rid, 0) + 1
        out = pipeline.step(_records(chunks, offset))
        offset += len(chunks)
        assert pipeline.budget.charged_bytes <= streams * 100
        assert pipeline.budget.streams == len(pipeline._streams)
        assert out.evictions.get(EVICTED_BY_BUDGET, 0) == sum(
            d.reason == "evicted" and "state budget" in d.error for d in out.dead_letters
        )


@pytest.mark.parametrize("limit", [-1])
def test_a_negative_budget_is_refused(limit: int) -> None:
    with pytest.raises(ValueError, match="state budget"):
        StateBudget(limit, 1)
