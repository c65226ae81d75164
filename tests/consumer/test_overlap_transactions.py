"""Overlapping transactions (consumers/overlap_transactions.py) on fake producers, without
Kafka: the next step is produced while the previous commits, commits only after it, is aborted
with it, and waits for its records first (log order). The broker run is
test_vocode_kafka.py::test_overlapping_transactions_survive_sigkill_exactly_once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from codeclog.consumers import kafka_calls
from codeclog.consumers.kafka_calls import InfrastructureError, StuckCallError
from codeclog.consumers.metrics import VocoderMetrics
from codeclog.consumers.overlap_transactions import OverlappingTransactions, overlap_ids

EVENTS: list[tuple[str, str]] = []  # (producer, call), in the order they happened


class FakeProducer:
    """Records every call; a commit can be held (`hold`) or made to fail (`fail_commit`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.hold = threading.Event()
        self.hold.set()
        self.fail_commit: KafkaException | None = None
        self.unflushed = 0  # records flush() leaves undelivered
        self.open = False

    def _note(self, call: str) -> None:
        EVENTS.append((self.name, call))

    def begin_transaction(self) -> None:
        assert not self.open, f"{self.name}: a second transaction on one producer"
        self.open = True
        self._note("begin")

    def produce(self, topic: str, key: bytes, value: bytes, **kwargs: Any) -> None:
        assert self.open
        self._note(f"produce {value.decode()}")

    def send_offsets_to_transaction(self, positions: Any, metadata: Any, timeout: float) -> None:
        self._note("offsets")

    def flush(self, timeout: float) -> int:
        self._note("flushed")
        return self.unflushed

    def commit_transaction(self, timeout: float) -> None:
        self._note("commit called")
        self.hold.wait()
        if self.fail_commit is not None:
            raise self.fail_commit
        self.open = False
        self._note("committed")

    def abort_transaction(self, timeout: float) -> None:
        if not self.open:
            raise KafkaException(KafkaError(KafkaError._STATE, "no transaction"))
        self.open = False
        self._note("aborted")


@pytest.fixture(autouse=True)
def _fresh_events(monkeypatch: pytest.MonkeyPatch) -> None:
    EVENTS.clear()
    monkeypatch.setattr(kafka_calls, "CALL_GRACE_S", 0.1)


def _overlap(timeout_s: float = 5.0) -> tuple[OverlappingTransactions, list[FakeProducer]]:
    tx = OverlappingTransactions({}, "g-0", 60_000, timeout_s, VocoderMetrics.create(None))
    fakes = [FakeProducer("a"), FakeProducer("b")]
    for slot, fake in zip(tx.slots, fakes, strict=True):
        slot.producer = fake  # type: ignore[assignment]
    return tx, fakes


def _step(tx: OverlappingTransactions, name: str, done: list[str]) -> None:
    tx.await_turn()
    tx.begin()
    tx.produce("audio", "r", name.encode())
    tx.send_offsets([], None)
    tx.commit_in_background(lambda: done.append(name))


def _aborted(tx: OverlappingTransactions) -> float:
    """codeclog_vocoder_transactions_total{result="aborted"}."""
    return tx.slots[0].metrics.transactions.labels(result="aborted")._value.get()  # type: ignore[no-any-return]


def _index(event: tuple[str, str]) -> int:
    return EVENTS.index(event)


def test_two_ids_derived_from_the_member_id() -> None:
    assert overlap_ids("codeclog-vocoder-0") == (
        "codeclog-vocoder-0",
        "codeclog-vocoder-0-overlap",
    )


def test_the_next_step_is_produced_while_the_previous_commits_and_commits_after_it() -> None:
    tx, (a, _b) = _overlap()
    a.hold.clear()  # step 0's commit takes its time
    done: list[str] = []
    _step(tx, "s0", done)
    _step(tx, "s1", done)  # begins and produces on the other producer meanwhile
    assert ("b", "produce s1") in EVENTS and ("a", "committed") not in EVENTS
    time.sleep(0.1)
    assert ("b", "commit called") not in EVENTS  # waits for step 0's commit
    a.hold.set()
    tx.await_commit()
    assert done == ["s0", "s1"]
    assert _index(("a", "committed")) < _index(("b", "commit called"))
    # log order: step 1 produced only after step 0's records were acknowledged
    assert _index(("a", "flushed")) < _index(("b", "produce s1"))


def test_a_third_step_waits_for_the_first_producer() -> None:
    tx, (a, _b) = _overlap()
    a.hold.clear()
    done: list[str] = []
    _step(tx, "s0", done)
    _step(tx, "s1", done)
    third = threading.Thread(target=_step, args=(tx, "s2", done))
    third.start()
    time.sleep(0.1)
    assert ("a", "produce s2") not in EVENTS  # at most two in flight
    a.hold.set()
    third.join(5)
    tx.await_commit()
    assert done == ["s0", "s1", "s2"]
    assert _index(("a", "committed")) < _index(("a", "produce s2"))


def test_a_failed_commit_aborts_the_next_step_too() -> None:
    tx, (a, _b) = _overlap()
    a.hold.clear()
    a.fail_commit = KafkaException(
        KafkaError(KafkaError._TIMED_OUT, "commit failed", txn_requires_abort=True)
    )
    done: list[str] = []
    _step(tx, "s0", done)
    _step(tx, "s1", done)
    a.hold.set()
    with pytest.raises(KafkaException, match="commit failed") as failure:
        tx.await_commit()
    tx.handle_error(failure.value)
    assert done == []
    assert ("b", "commit called") not in EVENTS
    assert ("a", "aborted") in EVENTS and ("b", "aborted") in EVENTS
    assert _aborted(tx) == 2  # the failed step and the one aborted with it
    assert not tx.wedged
    a.fail_commit = None
    _step(tx, "s2", done)  # after the rewind the order starts again, on the first producer
    tx.await_commit()
    assert done == ["s2"] and ("a", "produce s2") in EVENTS


def test_a_later_failure_keeps_the_earlier_commit() -> None:
    tx, (_a, b) = _overlap()
    b.fail_commit = KafkaException(
        KafkaError(KafkaError._TIMED_OUT, "second failed", txn_requires_abort=True)
    )
    done: list[str] = []
    _step(tx, "s0", done)
    _step(tx, "s1", done)
    with pytest.raises(KafkaException, match="second failed") as failure:
        tx.await_commit()
    tx.handle_error(failure.value)
    assert done == ["s0"]
    assert ("b", "aborted") in EVENTS and ("a", "aborted") not in EVENTS


def test_a_failure_while_the_next_step_is_built_aborts_only_it() -> None:
    tx, (a, _b) = _overlap()
    a.hold.clear()
    done: list[str] = []
    _step(tx, "s0", done)
    tx.await_turn()
    tx.begin()
    error = KafkaException(KafkaError(KafkaError._TRANSPORT, "produce failed", retriable=True))
    a.hold.set()
    tx.handle_error(error)  # as the service does when a produce raises
    assert done == ["s0"]  # the earlier step still commits
    assert ("b", "aborted") in EVENTS


@pytest.mark.parametrize("which", [0, 1])
def test_either_producer_fenced_ends_the_member(which: int) -> None:
    tx, fakes = _overlap()
    fakes[which].fail_commit = KafkaException(
        KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)
    )
    fakes[0].hold.clear()  # both steps in flight before either commit answers
    done: list[str] = []
    _step(tx, "s0", done)
    _step(tx, "s1", done)
    fakes[0].hold.set()
    with pytest.raises(KafkaException) as failure:
        tx.await_commit()
    with pytest.raises(InfrastructureError, match="fenced"):
        tx.handle_error(failure.value)
    assert tx.wedged


def test_a_stuck_commit_is_given_up_on_with_the_next_step() -> None:
    tx, (a, _b) = _overlap(timeout_s=0.1)
    a.hold.clear()  # never returns in time
    done: list[str] = []
    _step(tx, "s0", done)
    _step(tx, "s1", done)
    with pytest.raises(StuckCallError, match="commit_transaction"):
        tx.await_commit()
    a.hold.set()  # it returns late: it no longer counts
    time.sleep(0.1)
    assert done == [] and ("b", "commit called") not in EVENTS


def test_undelivered_records_of_a_step_stop_the_next_before_it_produces() -> None:
    tx, (a, _b) = _overlap()
    a.unflushed = 3
    done: list[str] = []
    _step(tx, "s0", done)
    with pytest.raises(StuckCallError, match="flush") as failure:
        _step(tx, "s1", done)
    tx.handle_error(failure.value)
    assert ("b", "produce s1") not in EVENTS and ("a", "commit called") not in EVENTS
    assert tx.slots[0].wedged  # replaced by the service's ensure_producer
    assert done == []
