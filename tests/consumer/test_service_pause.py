"""While a step decodes, the member keeps polling; a whole waiting batch pauses the assignment.

The decode of a step runs on a worker thread and the main thread polls meanwhile: records become
the next step's batch; once max_records of them wait, every assigned partition is paused until
the step ends, then what is still assigned resumes. A rebalance during the step waits for the
decode and voids the step. These tests pin that call pattern with a recording stand-in for the
consumer; the real broker runs it in the end-to-end tests (test_vocode_kafka.py).
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from codeclog.consumers.member.config import VocodeConfig
from codeclog.consumers.member.service import VocoderService
from codeclog.consumers.stream.pipeline import StepOutput
from codeclog.schemas.records import AudioChunk
from codeclog.topics_config import TopicsConfig
from tests.fake_kafka import FakeMessage


class FakeConsumer:
    """Hands out `arriving` messages one per call; records every call."""

    def __init__(self, partitions: list[int], arriving: int = 0) -> None:
        self.owned = [TopicPartition("chunks", p) for p in partitions]
        self.arriving = [
            FakeMessage("chunks", partitions[0], offset, b"r", b"v") for offset in range(arriving)
        ]
        self.calls: list[tuple[str, Any]] = []
        self.on_poll: Any = None  # called from inside poll/consume, as librdkafka calls callbacks

    def assignment(self) -> list[TopicPartition]:
        return list(self.owned)

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("pause", sorted(tp.partition for tp in partitions)))

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("resume", sorted(tp.partition for tp in partitions)))

    def _callbacks(self) -> None:
        if self.on_poll is not None:
            callback, self.on_poll = self.on_poll, None
            callback()

    def poll(self, timeout: float) -> None:
        self.calls.append(("poll", timeout))
        self._callbacks()
        time.sleep(timeout)

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        self.calls.append(("consume", num_messages))
        self._callbacks()
        time.sleep(timeout)
        taken, self.arriving = self.arriving[:1], self.arriving[1:]
        return taken


class SlowPipeline:
    """pipeline.step that takes `seconds` (or raises `error`); records what touches it when."""

    def __init__(self, seconds: float, error: Exception | None = None) -> None:
        self.seconds = seconds
        self.error = error
        self.events: list[str] = []

    def step(self, records: Any) -> StepOutput:
        time.sleep(self.seconds)
        self.events.append("step done")
        if self.error is not None:
            raise self.error
        return StepOutput(records=len(records))

    def drop_partition(self, partition: int) -> None:
        self.events.append(f"drop {partition}")


def _service(pipeline: SlowPipeline, consumer: FakeConsumer, max_records: int = 3) -> Any:
    config = VocodeConfig(poll_timeout_s=0.01, max_records=max_records)
    service = VocoderService({}, TopicsConfig(), config, engine=None)  # type: ignore[arg-type]
    service.pipeline = pipeline  # type: ignore[assignment]
    service.intake.consumer = consumer  # type: ignore[assignment]
    return service


def _decode(service: Any) -> StepOutput | None:
    """One step's decode through the member's intake, as `_transaction` runs it."""
    result: StepOutput | None = service.intake.decode(lambda: service.pipeline.step(["a"]))
    return result


def test_records_polled_during_a_step_are_the_next_batch() -> None:
    consumer = FakeConsumer([0, 1], arriving=2)
    service = _service(SlowPipeline(0.2), consumer)
    out = _decode(service)
    assert out is not None and out.records == 1
    assert [r.position.offset for r in service.intake._pending] == [0, 1]
    assert ("pause", [0, 1]) not in consumer.calls  # two waiting: room for one more
    assert [r.position.offset for r in service.intake.poll()] == [0, 1]  # no consume needed
    assert service.intake._pending == []


def test_a_whole_waiting_batch_pauses_the_assignment_until_the_step_ends() -> None:
    consumer = FakeConsumer([0, 1, 2], arriving=10)
    service = _service(SlowPipeline(0.3), consumer, max_records=3)
    _decode(service)
    assert len(service.intake._pending) == 3  # nothing more was taken once a batch waited
    kinds = [kind for kind, _ in consumer.calls]
    assert consumer.calls[kinds.index("pause")] == ("pause", [0, 1, 2])
    assert consumer.calls[-1] == ("resume", [0, 1, 2])
    assert kinds[kinds.index("pause") :].count("poll") >= 5  # still polling while paused
    assert "consume" not in kinds[kinds.index("pause") :]
    assert service.stats["pauses"] == 1


def test_a_rebalance_during_the_step_waits_for_the_decode_and_voids_the_step() -> None:
    consumer = FakeConsumer([0, 1])
    pipeline = SlowPipeline(0.3)
    service = _service(pipeline, consumer)

    def revoke_partition_1() -> None:
        consumer.owned = [TopicPartition("chunks", 0)]
        service.intake._on_revoke(consumer, [TopicPartition("chunks", 1)])

    consumer.on_poll = revoke_partition_1
    assert _decode(service) is None
    assert pipeline.events == ["step done", "drop 1"]  # the pipeline changed after the decode


def test_a_failing_step_is_raised_on_the_main_thread() -> None:
    consumer = FakeConsumer([3], arriving=5)
    service = _service(SlowPipeline(0.2, RuntimeError("decoder broke")), consumer, max_records=2)
    with pytest.raises(RuntimeError, match="decoder broke"):
        _decode(service)
    assert consumer.calls[-1] == ("resume", [3])  # paused (a batch waited), then resumed
    assert service.intake._decoding is None


def test_the_decode_runs_on_another_thread() -> None:
    seen: list[str] = []

    class Recording(SlowPipeline):
        def step(self, records: Any) -> StepOutput:
            seen.append(threading.current_thread().name)
            return super().step(records)

    _decode(_service(Recording(0.0), FakeConsumer([0])))
    assert seen == ["codeclog-decode"]


def test_a_partition_lost_while_paused_is_resumed_when_it_comes_back() -> None:
    """librdkafka keeps a partition's pause across revocation and re-assignment: one that was
    lost while a decode had it paused must be resumed once it is ours again (else it stays
    paused for good: the stall seen after a leader's SIGKILL)."""
    consumer = FakeConsumer([0, 1], arriving=10)
    service = _service(SlowPipeline(0.3), consumer, max_records=2)
    paused_seen = threading.Event()

    def lose_partition_1() -> None:  # the session expired mid-decode: assignment lost
        consumer.owned = [TopicPartition("chunks", 0)]
        paused_seen.set()

    original_pause = consumer.pause

    def pause(partitions: list[TopicPartition]) -> None:
        original_pause(partitions)
        consumer.on_poll = lose_partition_1

    consumer.pause = pause  # type: ignore[method-assign]
    _decode(service)
    assert paused_seen.is_set() and ("pause", [0, 1]) in consumer.calls
    assert consumer.calls[-1] == ("resume", [0])  # partition 1 is not ours: not resumed yet
    service.intake._pending.clear()
    consumer.owned = [TopicPartition("chunks", 0), TopicPartition("chunks", 1)]  # back again
    consumer.arriving = []
    service.intake.poll()
    assert ("resume", [1]) in consumer.calls
    calls = len(consumer.calls)
    service.intake.poll()  # resumed once: nothing left to resume
    assert not any(kind == "resume" for kind, _ in consumer.calls[calls:])


def test_rebalance_callbacks_served_by_close_neither_raise_nor_rebuild() -> None:
    """librdkafka serves a pending rebalance inside close: the member is leaving, so an
    assignment is not rebuilt (no committed-offsets read) and a revocation drops what it held."""
    consumer = FakeConsumer([0, 1])
    pipeline = SlowPipeline(0.0)
    service = _service(pipeline, consumer)
    asked: list[Any] = []

    def committed(partitions: list[TopicPartition]) -> list[TopicPartition]:
        asked.append(partitions)
        return []

    service.intake.committed = committed

    def close() -> None:
        service.intake._on_revoke(consumer, [TopicPartition("chunks", 1)])
        service.intake._on_assign(consumer, [TopicPartition("chunks", 2)])

    consumer.close = close  # type: ignore[attr-defined]
    service._close(1.0)
    assert pipeline.events == ["drop 1"]
    assert asked == [] and service._assign_failed is None
    assert service.intake.consumer is None


class AudioPipeline(SlowPipeline):
    """A step that makes one window, and what the member asks of the pipeline after it."""

    def step(self, records: Any) -> StepOutput:
        super().step(records)
        pcm = b"\1\0" * 48
        window = AudioChunk(
            request_id="r1",
            cache_epoch=0,
            chunk_seqs=(0,),
            window_index=0,
            sample_offset=0,
            sample_rate_hz=24000,
            pcm_s16le=pcm,
            sha256=hashlib.sha256(pcm).hexdigest(),
            final=False,
            determinism_domain="d",
        )
        return StepOutput(records=len(records), audio=[window])

    def open_streams(self) -> int:
        return 1

    def fold_state_bytes(self) -> int:
        return 0

    def remembered_requests(self) -> int:
        return 0


@pytest.mark.parametrize("void", [False, True])
def test_a_steps_windows_go_out_live_from_the_decode_thread_as_it_ends(void: bool) -> None:
    """The live copy is written by the thread that decoded the step, as soon as the step
    returns: not once the polling thread has noticed the end (on a busy machine that thread
    first waits for a core: issue 42's median). A step voided by a rebalance meanwhile has
    gone out live too, as a step whose transaction aborts: its re-decode is the same bytes."""
    consumer = FakeConsumer([0])
    service = _service(AudioPipeline(0.05), consumer)
    live: list[tuple[str, list[str]]] = []
    service.live.write = lambda writes: live.append(
        (threading.current_thread().name, [w.topic for w in writes])
    )
    service.intake.positions = lambda: []
    service.intake.group_metadata = lambda: None
    queued: list[Any] = []
    service.transactions.write_step = lambda step, on_committed: queued.append(step)
    if void:
        consumer.on_poll = service.intake._join_decode  # a rebalance callback during the step
        service.intake.committed = lambda partitions: []
        service.intake.seek_to = lambda positions: None
        service.transactions.await_commit = lambda: None
    service._transaction(["a"])
    assert live == [("codeclog-decode", [service.topics.live])]
    assert len(queued) == (0 if void else 1)
