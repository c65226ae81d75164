"""A saturated decoder pauses the assignment and the loop keeps polling until the step ends.

The decode of a step runs on a worker thread; a step still running after pause_after_s pauses
every assigned partition, polls (so rebalance callbacks run and max.poll.interval.ms is kept)
and resumes what is still assigned. A rebalance during the step waits for the decode and voids
the step. These tests pin that call pattern with a recording stand-in for the consumer; the
real broker runs it in the end-to-end tests (test_vocode_kafka.py), whose tiny-model steps
outlast the threshold there.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from codeclog.config import TopicsConfig
from consumers.pipeline import StepOutput
from consumers.service import VocodeConfig, VocoderService


class FakeConsumer:
    def __init__(self, partitions: list[int]) -> None:
        self.owned = [TopicPartition("chunks", p) for p in partitions]
        self.calls: list[tuple[str, Any]] = []
        self.on_poll: Any = None  # called from inside poll, as librdkafka calls callbacks

    def assignment(self) -> list[TopicPartition]:
        return list(self.owned)

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("pause", sorted(tp.partition for tp in partitions)))

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("resume", sorted(tp.partition for tp in partitions)))

    def poll(self, timeout: float) -> None:
        self.calls.append(("poll", timeout))
        if self.on_poll is not None:
            callback, self.on_poll = self.on_poll, None
            callback()
        time.sleep(timeout)


class SlowPipeline:
    """pipeline.step that takes `seconds` (or raises `error`); records what touches it when."""

    def __init__(self, seconds: float, error: Exception | None = None) -> None:
        self.seconds = seconds
        self.error = error
        self.events: list[str] = []
        self.decoding = threading.Event()

    def step(self, records: Any) -> StepOutput:
        self.decoding.set()
        time.sleep(self.seconds)
        self.events.append("step done")
        if self.error is not None:
            raise self.error
        return StepOutput(records=len(records))

    def drop_partition(self, partition: int) -> None:
        self.events.append(f"drop {partition}")


def _service(pipeline: SlowPipeline, consumer: FakeConsumer) -> VocoderService:
    config = VocodeConfig(pause_after_s=0.05, poll_timeout_s=0.01)
    service = VocoderService({}, TopicsConfig(), config, engine=None)  # type: ignore[arg-type]
    service.pipeline = pipeline  # type: ignore[assignment]
    service._consumer = consumer  # type: ignore[assignment]
    return service


def test_a_fast_step_neither_pauses_nor_polls() -> None:
    consumer = FakeConsumer([0, 1])
    out = _service(SlowPipeline(0.0), consumer)._decode(["r"])  # type: ignore[list-item]
    assert out is not None and out.records == 1
    assert consumer.calls == []


def test_a_slow_step_pauses_the_assignment_polls_and_resumes() -> None:
    consumer = FakeConsumer([0, 1, 2])
    service = _service(SlowPipeline(0.3), consumer)
    out = service._decode(["a", "b"])  # type: ignore[list-item]
    assert out is not None and out.records == 2
    kinds = [kind for kind, _ in consumer.calls]
    assert kinds[0] == "pause" and kinds[-1] == "resume"
    assert consumer.calls[0] == ("pause", [0, 1, 2]) and consumer.calls[-1] == ("resume", [0, 1, 2])
    assert kinds.count("poll") >= 5  # the member kept polling while the decoder worked


def test_a_rebalance_during_the_step_waits_for_the_decode_and_voids_the_step() -> None:
    consumer = FakeConsumer([0, 1])
    pipeline = SlowPipeline(0.3)
    service = _service(pipeline, consumer)

    def revoke_partition_1() -> None:
        consumer.owned = [TopicPartition("chunks", 0)]
        service._on_revoke(consumer, [TopicPartition("chunks", 1)])  # type: ignore[arg-type]

    consumer.on_poll = revoke_partition_1
    assert service._decode(["a"]) is None  # type: ignore[list-item]
    assert pipeline.events == ["step done", "drop 1"]  # the pipeline changed after the decode
    assert consumer.calls[-1] == ("resume", [0])  # only what is still assigned


def test_a_failing_step_is_raised_on_the_main_thread_and_resumes() -> None:
    consumer = FakeConsumer([3])
    service = _service(SlowPipeline(0.2, RuntimeError("decoder broke")), consumer)
    with pytest.raises(RuntimeError, match="decoder broke"):
        service._decode(["a"])  # type: ignore[list-item]
    assert consumer.calls[-1] == ("resume", [3])
    assert service._decoding is None
