"""How the consumer service talks to librdkafka: never waits for a full batch; the background
transactions take every queued step and hand their outcome to the main thread.

`Consumer.consume(n, timeout)` returns only when n records are there or the timeout expires, so a
plain `consume(max_records, 0.05)` added up to 50 ms to every chunk at low load. These tests pin
the call pattern with a recording stand-in for the librdkafka queue (no broker involved: the
behaviour under test is which calls the service makes). The commit tests use a producer that
fails once, which a live broker cannot be made to do on demand; the end-to-end exactly-once
tests (test_vocode_kafka.py) cover the commit on the real broker.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from codeclog.consumers.member.config import VocodeConfig
from codeclog.consumers.member.service import VocoderService
from codeclog.consumers.member.step_writes import OutputRecord, StepWrites
from codeclog.consumers.member.transaction import Transactions
from codeclog.consumers.stream.pipeline import StepOutput
from codeclog.topics_config import TopicsConfig
from tests.fake_kafka import FakeTransactional


class RecordingQueue:
    """Hands out queued items the way consume() does and records every call."""

    def __init__(self, ready: list[str], arriving: list[str]) -> None:
        self.ready = list(ready)  # already fetched
        self.arriving = list(arriving)  # arrive while a blocking call waits
        self.calls: list[tuple[int, float]] = []

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        self.calls.append((num_messages, timeout))
        if not self.ready and timeout > 0:
            self.ready, self.arriving = self.arriving, []
        taken, self.ready = self.ready[:num_messages], self.ready[num_messages:]
        return taken


def _service(max_records: int = 64, poll_timeout_s: float = 0.05) -> VocoderService:
    config = VocodeConfig(max_records=max_records, poll_timeout_s=poll_timeout_s)
    return VocoderService({}, TopicsConfig(), config, engine=None)  # type: ignore[arg-type]


def test_records_already_fetched_are_taken_without_waiting() -> None:
    queue = RecordingQueue(ready=["a", "b", "c"], arriving=["late"])
    assert _service().intake._fetched(queue) == ["a", "b", "c"]  # type: ignore[arg-type]
    assert queue.calls == [(64, 0)]


def test_an_empty_queue_waits_for_the_first_record_only_then_drains() -> None:
    queue = RecordingQueue(ready=[], arriving=["a", "b"])
    assert _service(poll_timeout_s=0.2).intake._fetched(queue) == ["a", "b"]  # type: ignore[arg-type]
    assert queue.calls == [(64, 0), (1, 0.2), (63, 0)]


def test_a_full_batch_is_capped_at_max_records() -> None:
    queue = RecordingQueue(ready=[str(i) for i in range(10)], arriving=[])
    assert _service(max_records=4).intake._fetched(queue) == ["0", "1", "2", "3"]  # type: ignore[arg-type]
    assert queue.ready == ["4", "5", "6", "7", "8", "9"]


def test_nothing_arriving_returns_empty_after_one_wait() -> None:
    queue = RecordingQueue(ready=[], arriving=[])
    assert _service().intake._fetched(queue) == []  # type: ignore[arg-type]
    assert queue.calls == [(64, 0), (1, 0.05)]


class CommitOnce(FakeTransactional):
    """A producer whose commit_transaction fails once with `error`, then succeeds."""

    def __init__(self, error: KafkaException | None) -> None:
        super().__init__()
        self.error = error

    def commit_transaction(self, timeout: float) -> None:
        self.commits += 1
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def _committing(service: VocoderService, producer: CommitOnce) -> None:
    assert isinstance(service.transactions, Transactions)
    service.transactions.producer = producer  # type: ignore[assignment]
    service.transactions.write_step(
        StepWrites([], [], [], None), lambda: service._committed_step(StepOutput(), 0.0)
    )


def test_a_failed_background_commit_is_raised_on_the_main_thread() -> None:
    service = _service()
    failure = KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit timed out"))
    _committing(service, CommitOnce(failure))
    with pytest.raises(KafkaException) as caught:
        service.transactions.await_commit()
    assert caught.value is failure
    service.transactions.await_commit()  # reported once: nothing is pending any more


def test_a_rebalance_waits_for_the_commit_and_leaves_its_failure_to_the_loop() -> None:
    service = _service()
    failure = KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit timed out"))
    _committing(service, CommitOnce(failure))
    service.transactions.join()  # inside a rebalance callback: never raises
    assert isinstance(service.transactions, Transactions)
    assert not service.transactions.committing
    with pytest.raises(KafkaException):
        service.transactions.await_commit()  # the next step discards its results and rewinds


def test_a_successful_commit_accounts_for_its_step() -> None:
    service = _service()
    producer = CommitOnce(None)
    _committing(service, producer)
    service.transactions.await_commit()
    assert producer.commits == 1
    assert service.stats["steps"] == 1


class HeldCommit(FakeTransactional):
    """Its first commit waits until `release` is set; the others fail with `error`, if any."""

    def __init__(self, error: KafkaException | None = None) -> None:
        super().__init__()
        self.release = threading.Event()
        self.committing = threading.Event()
        self.error = error

    def commit_transaction(self, timeout: float) -> None:
        self.committing.set()
        if self.commits == 0:
            self.release.wait(10)
        elif self.error is not None:
            raise self.error
        self.commits += 1


def _step(name: str) -> StepWrites:
    return StepWrites([OutputRecord("audio", name, name.encode())], [], [], None)


def _writing_a(producer: HeldCommit) -> tuple[Transactions, list[str]]:
    """A member's transactions on `producer`, step "a" queued and its commit held; `done`
    lists the steps whose on_committed ran."""
    transactions = _service().transactions
    assert isinstance(transactions, Transactions)
    transactions.producer = producer  # type: ignore[assignment]
    done: list[str] = []
    transactions.write_step(_step("a"), lambda: done.append("a"))
    assert producer.committing.wait(10)
    return transactions, done


def test_steps_queued_during_a_transaction_go_into_the_next_one_together() -> None:
    """The member never waits for a transaction: steps queue while one commits and the writer
    takes them all into the next."""
    producer = HeldCommit()
    transactions, done = _writing_a(producer)
    transactions.write_step(_step("b"), lambda: done.append("b"))  # returns at once
    transactions.write_step(_step("c"), lambda: done.append("c"))
    assert done == [] and producer.produced == [("audio", b"a")]
    producer.release.set()
    transactions.await_commit()
    assert done == ["a", "b", "c"] and producer.commits == 2
    assert producer.produced == [("audio", b"a"), ("audio", b"b"), ("audio", b"c")]


def test_a_failed_transaction_discards_the_steps_queued_behind_it_and_is_raised_once() -> None:
    failure = KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit timed out"))
    producer = HeldCommit(failure)
    transactions, done = _writing_a(producer)
    transactions.write_step(_step("b"), lambda: done.append("b"))
    producer.release.set()  # a commits; b's transaction fails
    transactions.join()
    with pytest.raises(KafkaException) as caught:
        transactions.write_step(_step("c"), lambda: done.append("c"))  # the next step
    assert caught.value is failure and done == ["a"]
    transactions.await_commit()  # raised once; c was not queued
    assert done == ["a"] and not transactions.committing
