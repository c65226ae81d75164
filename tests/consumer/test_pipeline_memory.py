"""A live member runs for days and sees thousands of requests an hour (issue 43's soak): outside
the fold's own bounded state (tombstones, tests/fold/test_fold_memory.py), its pipeline keeps
nothing per finished request. The member's pipeline used to keep every outcome of every request
for a replay report it never wrote, and where every request ever seen lived."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from collections.abc import Callable

from codeclog.consumers.member.config import VocodeConfig
from codeclog.consumers.stream.fold.rules import fold
from codeclog.consumers.stream.fold.state import new_state
from codeclog.consumers.stream.limit import LimitOptions
from codeclog.consumers.stream.pipeline import AudioPipeline
from codeclog.kafka.records import InputRecord, Position
from codeclog.producers.synthetic import SyntheticConfig, merged, scripts
from codeclog.producers.talker import Record, Talker
from codeclog.schemas import wire

ROUNDS = 6  # one after another, as a talker's sessions come and go
SESSIONS = 50  # per round
ROOM_B = 24  # per request: allocator noise and high-water marks, never a per-request entry


class Records:
    def __init__(self) -> None:
        self.records: list[Record] = []

    def publish(self, record: Record) -> None:
        self.records.append(record)


def chunk_records(seed: int) -> tuple[list[InputRecord], int]:
    """Rounds of synthetic duplex sessions (turns, barge-ins, aborts), each finished, as the
    chunk topic's records in one partition; and how many requests they are."""
    sink = Records()
    talker = Talker(sink, producer_id="t", native_duplex=True)
    for round_no in range(ROUNDS):
        config = SyntheticConfig(sessions=SESSIONS, seconds=6.0, seed=seed * 100 + round_no)
        for item in merged(scripts(config)):
            talker.apply(dataclasses.replace(item.step, now_ms=1))
    records = [
        InputRecord(Position("chunks", 0, offset), r.request_id.encode(), wire.encode(r))
        for offset, r in enumerate(sink.records)
    ]
    return records, len({r.request_id for r in sink.records})


def grown(run: Callable[[], object]) -> tuple[int, object]:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = run()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before, kept
    finally:
        tracemalloc.stop()


def test_the_members_pipeline_keeps_nothing_per_finished_request_beyond_the_fold() -> None:
    records, requests = chunk_records(seed=43)
    config = VocodeConfig()
    limit = LimitOptions().resolve(1, None)

    def through_the_pipeline() -> AudioPipeline:
        pipeline = AudioPipeline(config.pipeline(limit, 1 << 20), None)
        for start in range(0, len(records), 32):
            pipeline.step(records[start : start + 32])
        return pipeline

    def through_the_fold_alone() -> object:
        state = new_state(config.pipeline(limit, 1 << 20).fold)
        for record in records:
            event = wire.decode(record.value)
            assert not isinstance(event, bytes)
            fold(state, event)  # type: ignore[arg-type]
        return state

    pipeline_bytes, pipeline = grown(through_the_pipeline)
    fold_bytes, _ = grown(through_the_fold_alone)
    assert isinstance(pipeline, AudioPipeline) and pipeline.open_streams() == 0
    extra = (pipeline_bytes - fold_bytes) / requests
    assert extra <= ROOM_B, f"{extra:.0f} B per finished request outside the fold"
