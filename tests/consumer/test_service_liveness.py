"""The consumer's liveness bounds without a broker: a stuck librdkafka call is abandoned, the
producer is replaced, an outage ends in exit 1, being fenced ends the member. (The real broker
crash is in test_vocode_faults.py.)"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from codeclog.cli.commands import vocode as vocode_command
from codeclog.consumers.member import transaction as transaction_module
from codeclog.consumers.member.config import VocodeConfig
from codeclog.consumers.member.outage import OutageClock
from codeclog.consumers.member.service import VocoderService
from codeclog.consumers.member.step_writes import StepWrites
from codeclog.consumers.member.transaction import Transactions
from codeclog.consumers.stream.pipeline import StepOutput
from codeclog.kafka import calls as kafka_calls
from codeclog.kafka.access import KafkaAccessError
from codeclog.kafka.calls import (
    ClusterUnavailableError,
    InfrastructureError,
    OpenTransactionError,
    StuckCallError,
    bounded,
)
from codeclog.kafka.reader import input_record
from codeclog.topics_config import TopicsConfig
from tests.fake_kafka import FakeTransactional
from tests.processes import run_in_tree

EMPTY_STEP = StepWrites([], [], [], None)


def _service(**config: Any) -> VocoderService:
    return VocoderService({}, TopicsConfig(), VocodeConfig(**config), engine=None)  # type: ignore[arg-type]


def _transactions(service: VocoderService) -> Transactions:
    """The member's one TransactionBoundary implementation, to drive from the test."""
    assert isinstance(service.transactions, Transactions)
    return service.transactions


@pytest.fixture(autouse=True)
def _short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_calls, "CALL_GRACE_S", 0.1)


BOUNDED_CHILD = """
import gc, os, time
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from codeclog.devtools.soak_samples import kafka_handles
from codeclog.kafka.calls import bounded

def commit_that_times_out():
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})

    def commit():
        producer.poll(0)
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out"))

    with pytest.raises(KafkaException):
        bounded("commit_transaction", commit, 1.0)

gc.disable()
commit_that_times_out()
deadline = time.monotonic() + 5
while kafka_handles(os.getpid()) and time.monotonic() < deadline:
    time.sleep(0.05)
print(kafka_handles(os.getpid()))
"""


def test_an_error_raised_through_bounded_keeps_nothing_its_call_held_alive() -> None:
    """The exception a bounded call raises used to hold itself through the frame it was
    re-raised from (a reference cycle): the producer the call closed over, with its librdkafka
    threads and sockets, then lived until the cyclic collector's next full pass, which a
    member's large heap makes rare (issue 43's soak). With the collector off, the handle must
    go as soon as the exception does. In a fresh interpreter, where no other test's handles
    come and go."""
    done = run_in_tree([sys.executable, "-c", BOUNDED_CHILD], timeout_s=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"]


def test_a_call_past_its_timeout_is_abandoned_as_stuck() -> None:
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(StuckCallError, match="send_offsets_to_transaction did not return"):
        bounded("send_offsets_to_transaction", release.wait, 0.1)
    assert time.monotonic() - started < 1.0
    release.set()
    assert bounded("quick", lambda: 7, 0.1) == 7
    with pytest.raises(ValueError, match="boom"):
        bounded("raises", lambda: (_ for _ in ()).throw(ValueError("boom")), 0.1)


class StuckCommit(FakeTransactional):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def commit_transaction(self, timeout: float) -> None:
        self.release.wait()


def test_a_stuck_commit_is_abandoned_and_reported_once() -> None:
    service = _service(kafka_timeout_s=0.1)
    producer = StuckCommit()
    transactions = _transactions(service)
    transactions.producer = producer  # type: ignore[assignment]
    transactions.write_step(EMPTY_STEP, lambda: service._committed_step(StepOutput(), 0.0))
    transactions.join()  # a rebalance callback: bounded, never raises
    assert not transactions.committing
    with pytest.raises(StuckCallError, match="commit_transaction"):
        transactions.await_commit()
    producer.release.set()  # it returns late: it no longer counts
    time.sleep(0.1)
    assert service.stats["steps"] == 0
    transactions.await_commit()


def test_a_stuck_call_marks_the_producer_for_replacement() -> None:
    transactions = _transactions(_service())
    transactions.handle_error(StuckCallError("send_offsets_to_transaction", 15))
    assert transactions.wedged


def test_being_fenced_ends_the_member() -> None:
    service = _service()
    fenced = KafkaException(
        KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)
    )
    with pytest.raises(InfrastructureError, match="fenced"):
        service.transactions.handle_error(fenced)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_failures_past_the_outage_timeout_end_the_member() -> None:
    clock = _Clock()
    outage = OutageClock(0.5, "here", clock)
    error = KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
    outage.failed(error)  # the first failure starts the clock
    for _ in range(4):  # failures keep coming (each recovery attempt fails)
        clock.now += 0.1
        outage.failed(error)
    clock.now += 0.2
    with pytest.raises(InfrastructureError, match="no transaction committed for"):
        outage.failed(error)


def test_a_transaction_left_open_is_waited_for_until_its_coordinator_aborts_it() -> None:
    """A member SIGKILLed mid-transaction leaves it open on the progress partitions; the new
    owner's recovery reads them only once it is decided, and the coordinator aborts it within
    the transaction timeout (60 s) plus its 10 s check. With the outage limit at the same 60 s
    the new owner gave up first (exit 1: the secured SIGKILL test, beside a soak). Such a wait
    now lasts at least the transaction timeout plus a margin; any other failure keeps the
    outage limit."""
    service = _service(outage_timeout_s=60.0, transaction_timeout_ms=60_000)
    clock = _Clock()
    outage = OutageClock(60.0, "here", clock, service.outage.open_transaction_s)
    open_txn = OpenTransactionError("a transaction still open there")

    def fail_every_5_s_for(outage: OutageClock, exc: Exception, seconds: int) -> None:
        for _ in range(seconds // 5):  # each recovery attempt fails again
            outage.failed(exc)
            clock.now += 5.0

    fail_every_5_s_for(outage, open_txn, 85)  # the coordinator aborts 60-70 s in
    outage.failed(open_txn)
    with pytest.raises(InfrastructureError, match="no transaction committed for"):
        fail_every_5_s_for(outage, open_txn, 20)  # never decided: the cluster is not well
    other = OutageClock(60.0, "here", clock, service.outage.open_transaction_s)
    with pytest.raises(InfrastructureError):
        fail_every_5_s_for(other, ClusterUnavailableError("timed out"), 85)


def test_a_failure_long_after_the_last_one_starts_the_clock_again() -> None:
    clock = _Clock()
    outage = OutageClock(0.2, "here", clock)
    error = KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
    outage.failed(error)
    clock.now += 0.3  # healthy and idle meanwhile: nothing failed, nothing committed
    outage.failed(error)  # a new outage, not the old one going on


def test_a_commit_resets_the_outage_clock() -> None:
    service = _service(outage_timeout_s=0.2)

    service.outage.failed(KafkaException(KafkaError(KafkaError._TRANSPORT, "down")))
    transactions = _transactions(service)
    transactions.producer = FakeTransactional()  # type: ignore[assignment]
    transactions.write_step(EMPTY_STEP, lambda: service._committed_step(StepOutput(), 0.0))
    transactions.await_commit()
    assert service.outage.failing_since is None


def test_sigterm_ends_a_stuck_member_within_the_stop_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exits: list[int] = []
    monkeypatch.setattr(vocode_command.os, "_exit", exits.append)
    stop, finished = threading.Event(), threading.Event()
    vocode_command._watch_stop(stop, finished, 0.2, "here")
    stop.set()  # SIGTERM; the step never finishes (nothing sets `finished`)
    time.sleep(1.5)
    assert exits == [1]


class _Counter:
    def __init__(self) -> None:
        self.count = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.count += amount


class _DomainEngine:
    domain = "portable1:torch2.15:x86_64"


def test_a_stream_rebuilt_in_another_domain_is_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from codeclog.schemas.records import StreamCheckpoint

    service = VocoderService({}, TopicsConfig(), VocodeConfig(), engine=_DomainEngine())  # type: ignore[arg-type]
    service.metrics.domain_changes = counter = _Counter()

    def checkpoint(domain: str) -> StreamCheckpoint:
        return StreamCheckpoint("r", "t", 0, True, 0, 0, 5, 1, 960, determinism_domain=domain)

    same, other, unknown = _DomainEngine.domain, "native:torch2.15:cpu:GenuineIntel:AVX2:t1", ""
    checkpoints = {"a": checkpoint(same), "b": checkpoint(other), "c": checkpoint(unknown)}
    with caplog.at_level("WARNING"):
        service.recovery.check_domains(same, ["a", "b", "c"], checkpoints)
    assert counter.count == 1
    assert f"request b: checkpoint domain {other}, rebuilding in domain {same}" in caplog.text
    assert "request a" not in caplog.text and "request c" not in caplog.text


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
    ],
)
def test_an_authorization_failure_ends_the_member(code: int) -> None:
    service = _service()
    denied = KafkaException(KafkaError(code, "denied", txn_requires_abort=True))
    # a refused ACL is a configuration error: one line, exit 2 (codeclog.kafka.access)
    with pytest.raises(KafkaAccessError, match="is not authorised to"):
        _transactions(service).handle_error(denied)
    with pytest.raises(KafkaAccessError):
        service._rebuild_after(denied)  # recovery does not retry it for outage_timeout_s


def test_a_retriable_transaction_error_is_retried_not_the_end() -> None:
    service = _service()
    aborted: list[bool] = []
    transactions = _transactions(service)
    transactions.abort_quietly = lambda: aborted.append(True)  # type: ignore[method-assign]
    retriable = KafkaException(
        KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE, "moving", retriable=True)
    )
    transactions.handle_error(retriable)
    assert aborted == [True] and not transactions.wedged


def test_a_void_steps_rebuild_that_times_out_is_retried_not_the_end() -> None:
    """A rebalance during a step's decode voids the step, and the member rebuilds from the
    committed offsets. Reading them can time out while the group coordinator moves (issue 43's
    soak: member b exited 1 a minute into a run, `cannot read committed offsets: _TIMED_OUT`):
    that is retried until the outage limit, as every other rebuild is."""
    service = _service()
    tp = TopicPartition("codec.chunks", 0)
    answers: list[BaseException | list[TopicPartition]] = [
        ClusterUnavailableError("cannot read committed offsets: _TIMED_OUT"),
        [TopicPartition("codec.chunks", 0, 5)],
    ]

    def committed(partitions: list[TopicPartition]) -> list[TopicPartition]:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    intake: Any = service.intake
    intake.positions = lambda: []
    intake.decode = lambda step: None  # the assignment changed meanwhile: a void step
    intake.assignment = lambda: [tp]
    intake.committed = committed
    sought: list[list[TopicPartition]] = []
    intake.seek_to = sought.append
    service.recovery.restore = lambda pipeline, committed: {}  # type: ignore[method-assign]
    _transactions(service).ensure_producer = lambda reason="": None  # type: ignore[method-assign]
    assert service._step([]) == StepOutput()
    assert answers == [] and [tp.offset for tp in sought[0]] == [5]
    assert service.stats["void_steps"] == 1


class _Aborts:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return True


@pytest.mark.parametrize(
    "code", [KafkaError._TIMED_OUT, KafkaError._MSG_TIMED_OUT, KafkaError.REQUEST_TIMED_OUT]
)
def test_an_indefinite_outcome_re_initialises_the_producer_before_the_next_transaction(
    code: int,
) -> None:
    """A timed-out call may still land on the broker later, under the producer's epoch: the
    transaction is aborted and the producer replaced, so the new one's init_transactions bumps
    the epoch and fences it (docs/operating.md, "The defence against late requests"). With the
    test-only switch off the producer is kept, as before this defence."""
    timed_out = KafkaException(KafkaError(code, "timed out", retriable=True))
    for defended in (True, False):
        transactions = _transactions(_service())
        transactions.reinit_after_indefinite = defended
        aborts = _Aborts()
        transactions.abort_quietly = aborts  # type: ignore[method-assign]
        transactions.handle_error(timed_out)
        assert aborts.calls == 1
        assert transactions.wedged is defended and transactions.reinits == int(defended)


class _Message:
    def __init__(self, error: KafkaError) -> None:
        self._error = error

    def error(self) -> KafkaError:
        return self._error


def test_consumer_errors_retriable_are_skipped_denied_end_the_member() -> None:
    transport = _Message(KafkaError(KafkaError._TRANSPORT, "broker down", retriable=True))
    assert input_record(transport) is None  # type: ignore[arg-type]
    denied = _Message(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"))
    doing = {"topic": "READ topic chunks"}
    with pytest.raises(KafkaAccessError, match="READ topic chunks"):
        input_record(denied, {}, doing)  # type: ignore[arg-type]
    # a refusal of a resource this reader does not need (an assign()-only reader's unused
    # group id): harmless, skipped
    group = _Message(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "denied"))
    assert input_record(group, {}, doing) is None  # type: ignore[arg-type]


class _FailingClose:
    """A fenced producer whose flush and close also fail."""

    def flush(self, timeout: float) -> int:
        raise KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))


def test_a_fenced_member_prints_one_line_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    service = _service()
    transactions = _transactions(service)
    fenced = KafkaException(
        KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)
    )

    def start() -> None:
        transactions.producer = _FailingClose()  # type: ignore[assignment]

    def loop() -> None:
        transactions.handle_error(fenced)

    monkeypatch.setattr(service, "_start", start)
    monkeypatch.setattr(service, "_loop", loop)
    with pytest.raises(InfrastructureError, match="fenced"):
        service.run()  # the library raises; the command line prints it and exits 1
    assert vocode_command._run(service) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fenced" in err and "Traceback" not in err, err


class _InitAnswers:
    """A producer whose init_transactions answers from a script."""

    def __init__(self, answers: list[KafkaError | None]) -> None:
        self.answers = answers
        self.calls = 0

    def init_transactions(self, timeout: float) -> None:
        self.calls += 1
        answer = self.answers.pop(0)
        if answer is not None:
            raise KafkaException(answer)


def test_init_transactions_at_start_retries_concurrent_transactions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transaction_module, "RETRY_PAUSE_S", 0.01)
    transactions = _transactions(_service())
    busy = KafkaError(KafkaError.CONCURRENT_TRANSACTIONS, "previous transaction still open")
    producer = _InitAnswers([busy, busy, None])
    transactions.producer = producer  # type: ignore[assignment]
    transactions.init_with_retry(60, threading.Event())
    assert producer.calls == 3


def test_init_transactions_at_start_gives_up_on_a_fatal_error() -> None:
    transactions = _transactions(_service())
    denied = KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "denied", fatal=True)
    producer = _InitAnswers([denied])
    transactions.producer = producer  # type: ignore[assignment]
    with pytest.raises(KafkaException):
        transactions.init_with_retry(60, threading.Event())
    assert producer.calls == 1


class _Producer:
    """A producer whose commit can be held inside librdkafka (`hold`), and that says when it
    was closed (purged, flushed, then its handle destroyed by close())."""

    def __init__(self, config: Any = None) -> None:
        self.hold = threading.Event()
        self.hold.set()
        self.flushed = threading.Event()
        self.closed = threading.Event()

    def init_transactions(self, timeout: float) -> None:
        pass

    def commit_transaction(self, timeout: float) -> None:
        self.hold.wait()

    def purge(self) -> None:
        pass

    def flush(self, timeout: float) -> int:
        self.flushed.set()
        return 0

    def close(self) -> bool:
        assert self.flushed.is_set()  # what was queued went first
        self.closed.set()
        return True


def test_a_producer_given_up_on_is_destroyed_once_no_call_is_inside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A member that rides out a fault every few minutes gives up on a producer now and then
    (a fatal error, a stuck call): each used to stay for the life of the process with its
    threads and sockets (issue 43's soak: member b +14 threads, +26 fds after two). A fatal
    one is destroyed at once; a stuck one once its call returned, not before. Destroyed means
    closed: dropping the object left the handle to whatever still referenced it (the soak's
    next runs: one more handle after each indefinite outcome, until the collector's next full
    pass)."""
    monkeypatch.setattr(transaction_module, "Producer", _Producer)
    transactions = _transactions(_service(kafka_timeout_s=0.1))
    fatal_one = _Producer()
    transactions.producer = fatal_one  # type: ignore[assignment]
    fatal = KafkaError(KafkaError.INVALID_TXN_STATE, "invalid state", fatal=True)
    transactions.handle_error(KafkaException(fatal))
    transactions.ensure_producer("fatal")
    assert fatal_one.closed.wait(5) and transactions.abandoned == 0

    stuck_one = transactions.producer
    assert isinstance(stuck_one, _Producer)
    stuck_one.hold.clear()
    with pytest.raises(StuckCallError) as stuck:
        transactions.commit()
    transactions.handle_error(stuck.value)
    transactions.ensure_producer("stuck")
    assert transactions.abandoned == 1 and not stuck_one.closed.is_set()  # its call is inside
    stuck_one.hold.set()  # the call returns
    assert stuck.value.worker is not None
    stuck.value.worker.join(5)
    transactions.ensure_producer()  # the next replacement or step reaps it
    assert stuck_one.closed.wait(5) and transactions.abandoned == 0


def test_an_idle_member_handles_a_failed_transaction_at_once() -> None:
    """A transaction that fails while the member has nothing to do (its partitions just went
    to another member, or are quiet) is aborted at once, not at the member's next step: left
    open, it holds every read_committed reader of its partitions, and the new owner's
    recovery waits for it (issue 43's soak: member a, cut from its group coordinator and then
    without partitions, kept its transaction open 60 s, until the coordinator's timeout)."""
    service = _service()
    handled: list[BaseException] = []
    polls: list[int] = []  # failures handled when each poll began

    def poll() -> list[Any]:
        polls.append(len(handled))
        if len(polls) > 1:
            service.stop()
        return []

    intake: Any = service.intake
    intake.poll = poll
    intake.assignment = lambda: []  # its partitions went to another member
    transactions = _transactions(service)
    failure = KafkaException(KafkaError(KafkaError._TRANSPORT, "coordinator gone", retriable=True))
    transactions._writer._error = failure  # the writer's transaction failed meanwhile
    transactions.handle_error = handled.append  # type: ignore[method-assign]
    service._rebuild_after = lambda exc: None  # type: ignore[method-assign]
    service._loop()
    assert handled == [failure] and polls == [0, 1]  # on the first idle pass, not at the end


def test_more_producers_stuck_than_the_bound_end_the_member_for_a_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call stuck inside librdkafka keeps its producer's handle (13 fds, 7 threads) until it
    returns, minutes later or never (librdkafka #5456, #5511): beyond MAX_ABANDONED such
    producers the member ends (exit 1) instead of growing, and its supervisor starts it again."""
    monkeypatch.setattr(transaction_module, "Producer", _Producer)
    transactions = _transactions(_service(kafka_timeout_s=0.1))
    transactions.ensure_producer()
    stuck: list[_Producer] = []
    for n in range(transaction_module.MAX_ABANDONED + 1):
        producer = transactions.producer
        assert isinstance(producer, _Producer)
        producer.hold.clear()
        stuck.append(producer)
        with pytest.raises(StuckCallError) as call:
            transactions.commit()
        transactions.handle_error(call.value)
        if n < transaction_module.MAX_ABANDONED:
            transactions.ensure_producer("stuck")
            assert transactions.abandoned == n + 1
    with pytest.raises(InfrastructureError, match="still have a call stuck inside librdkafka"):
        transactions.ensure_producer("stuck")
    assert transactions.producer is None and not any(p.closed.is_set() for p in stuck)
    for held in stuck:
        held.hold.set()
