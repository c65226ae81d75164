"""The transaction boundary's one implementation (`Transactions`, behind `TransactionBoundary`):
the steps' transactions, one after another, off the member's path, and their failures.
Reasons: docs/operating.md, "A step and its transaction" and "Liveness bounds"."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from codeclog.consumers.member.boundary import TRANSACTION_ERRORS, TransactionError
from codeclog.consumers.member.metrics import VocoderMetrics
from codeclog.consumers.member.producer_config import transactional_producer_config
from codeclog.consumers.member.step_writes import StepWrites, merged
from codeclog.consumers.member.stuck_calls import StuckCalls, close_retired
from codeclog.consumers.member.transaction_queue import TransactionWriter
from codeclog.errors import CodeclogError
from codeclog.kafka.calls import (
    FENCED_CODES,
    INDEFINITE_CODES,
    RETRY_INIT_CODES,
    InfrastructureError,
    StuckCallError,
    kafka_error,
    one_line,
    raise_if_denied,
)

log = logging.getLogger("codeclog.vocode")

RETRY_PAUSE_S = 1.0  # between two init_transactions attempts at start
# Producers given up on with a call still stuck inside librdkafka, at most (each holds a handle:
# about 13 fds and 7 threads); one more ends the member (exit 1) for its supervisor to start
# again, the only way to release them: such a call can outlive its timeout by minutes or for
# good (librdkafka #5456, #5511; measured in the soak: send_offsets_to_transaction 2-5 minutes)
MAX_ABANDONED = 3
CLOSE_ON_FAILURE_S = 2.0  # abort, close and flush bounds once the member is exiting 1
Refusal = Callable[[BaseException], CodeclogError | None]


class Transactions:
    """The member's transactional producer and the one commit in flight."""

    def __init__(
        self,
        client_config: dict[str, str],
        transactional_id: str,
        transaction_timeout_ms: int,
        kafka_timeout_s: float,
        metrics: VocoderMetrics,
        refusal: Refusal = lambda exc: None,
        reinit_after_indefinite: bool = True,
        max_queued_bytes: int = 32 * 2**20,
    ) -> None:
        self.transactional_id = transactional_id
        self.producer_config = transactional_producer_config(
            client_config, transactional_id, transaction_timeout_ms
        )
        self.kafka_timeout_s = kafka_timeout_s
        self.metrics = metrics
        self.producer: Producer | None = None
        self.wedged = False  # a call on the producer got stuck or it hit a fatal error
        self.closing_timeout_s: float | None = None  # short bounds once the member exits 1
        self._needs_init = False
        # every call on the producer, bounded; the producers given up on with the calls stuck
        # inside them, destroyed once those returned
        self._calls = StuckCalls(MAX_ABANDONED, kafka_timeout_s)
        self._writer = TransactionWriter(self._write_transaction, max_queued_bytes)
        # A refused login or ACL as the error to end with (exit 2), None for any other error
        self.refusal = refusal
        # docs/operating.md, "The defence against late requests"; off only in the test that
        # shows it is what keeps the history clean
        self.reinit_after_indefinite = reinit_after_indefinite
        self.reinits = 0  # producers re-initialised after an indefinite outcome
        self._retiring = False  # the producer to replace is not stuck: close it, in the background

    @property
    def abandoned(self) -> int:
        """Producers given up on and not destroyed yet (a call is still inside, or not reaped
        yet). The CLI ends with os._exit when > 0: destroying a handle with a call still inside
        librdkafka can block."""
        return self._calls.abandoned

    @property
    def committing(self) -> bool:
        """Steps are queued or being written."""
        return self._writer.busy

    # -- the producer ---------------------------------------------------------------------------

    def start(self, retry_for_s: float, stop: threading.Event) -> None:
        """A new transactional producer, initialised (fences a previous incarnation). A
        retriable answer (the coordinator moving; the previous instance's open transaction still
        being aborted: CONCURRENT_TRANSACTIONS, seen after a member's SIGKILL during a leader
        failover) is retried for `retry_for_s`, or until `stop` is set."""
        self.producer = Producer(self.producer_config)
        self._needs_init = True
        self.init_with_retry(retry_for_s, stop)

    def init_with_retry(self, retry_for_s: float, stop: threading.Event) -> None:
        """init_transactions on the producer, retrying retriable answers (see `start`)."""
        deadline = time.monotonic() + retry_for_s
        while True:
            try:
                self._init()
                return
            except KafkaException as exc:
                error = kafka_error(exc)
                retriable = error is not None and (
                    not error.fatal() and (error.retriable() or error.code() in RETRY_INIT_CODES)
                )
                if not retriable or time.monotonic() > deadline or stop.wait(RETRY_PAUSE_S):
                    raise
                log.warning("init_transactions: %s: retrying", one_line(exc))

    def ensure_producer(self, reason: str = "") -> None:
        """Replace a wedged producer (same transactional id: init_transactions fences the
        old one and aborts its open transaction); finish a pending init_transactions."""
        self._calls.reap()
        if self.producer is None or self.wedged:
            if self.producer is not None:
                log.warning("replacing the transactional producer (%s)", reason)
                if self._retiring:
                    close_retired(self.producer, self.kafka_timeout_s)
                else:
                    self._calls.give_up(self.producer)
                    self._calls.reap()  # at once when no call is inside it (a fatal error)
                    if (too_many := self._calls.too_many()) is not None:
                        self.producer = None
                        raise too_many
            self._retiring = False
            self._calls.replaced()
            self.producer = Producer(self.producer_config)
            self.wedged = False
            self._needs_init = True
        if self._needs_init:
            try:
                self._init()
            except KafkaException as exc:
                error = kafka_error(exc)
                if error is not None and error.fatal():
                    self.wedged = True
                raise

    def close(self) -> None:
        """Flush and drop the producer (a wedged one is abandoned, never flushed)."""
        producer, self.producer = self.producer, None
        if producer is None:
            return
        if self.wedged:
            self._calls.give_up(producer)
            return
        bound = self.closing_timeout_s or self.kafka_timeout_s
        try:
            self._calls.bounded("flush", lambda: producer.flush(bound), bound)
        except TRANSACTION_ERRORS as exc:
            log.warning("producer flush failed: %s", one_line(exc))
            self._calls.give_up(producer)

    def _init(self) -> None:
        producer = self.producer
        assert producer is not None
        timeout = self.kafka_timeout_s
        self._calls.bounded(
            "init_transactions", lambda: producer.init_transactions(timeout), timeout
        )
        self._needs_init = False

    def mark_wedged(self) -> None:
        self.wedged = True

    def end_on_failure(self) -> None:
        self.closing_timeout_s = CLOSE_ON_FAILURE_S
        self.join()
        self.abort_quietly()

    def end_refused(self) -> None:
        self.closing_timeout_s = CLOSE_ON_FAILURE_S
        self.wedged = True  # nothing to abort that the refusal would not refuse
        self.join()

    # -- the steps' transactions ----------------------------------------------------------------

    def write_step(self, step: StepWrites, on_committed: Callable[[], None]) -> None:
        """Queue the step for the next transaction; `on_committed` runs on the writer's thread
        once it committed. Raises the failure of an earlier transaction instead (once)."""
        if self._calls.abandoned:
            self._calls.reap()
        self._writer.submit(step, on_committed)

    def _write_transaction(self, steps: Sequence[StepWrites]) -> None:
        """On the writer's thread: one transaction of `steps`, committed."""
        step = merged(steps)
        self.begin()
        for write in (*step.records, *step.checkpoints):
            self.produce(write.topic, write.key, write.value, write.partition)
        self.send_offsets(step.positions, step.group_metadata)
        self.commit()
        self.metrics.transactions.labels(result="committed").inc()

    def begin(self) -> None:
        assert self.producer is not None
        self.producer.begin_transaction()

    def produce(self, topic: str, key: str, value: bytes, partition: int | None = None) -> None:
        assert self.producer is not None
        kwargs: dict[str, Any] = {"key": key.encode(), "value": value}
        if partition is not None:
            kwargs["partition"] = partition
        deadline = time.monotonic() + self.kafka_timeout_s
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                return
            except BufferError:  # local queue full: let deliveries drain, then retry
                if time.monotonic() > deadline:
                    limit = self.kafka_timeout_s
                    raise StuckCallError("produce (local queue full)", limit) from None
                self.producer.poll(0.05)

    def send_offsets(self, positions: list[TopicPartition], group_metadata: Any) -> None:
        producer, timeout = self.producer, self.kafka_timeout_s
        assert producer is not None
        self._calls.bounded(
            "send_offsets_to_transaction",
            lambda: producer.send_offsets_to_transaction(positions, group_metadata, timeout),
            timeout,
        )

    def commit(self) -> None:
        """commit_transaction, bounded: one still running CALL_GRACE_S after its timeout is
        stuck (abandoned: whatever it does later no longer counts)."""
        producer, timeout = self.producer, self.kafka_timeout_s
        assert producer is not None
        self._calls.bounded(
            "commit_transaction", lambda: producer.commit_transaction(timeout), timeout
        )

    def join(self) -> None:
        """Wait until every queued step is committed or the writer stopped on a failure,
        without raising (rebalance callbacks, shutdown): the failure stays recorded for
        `await_commit` or the next `write_step`."""
        self._writer.join()

    def await_commit(self) -> None:
        """Wait until every queued step is committed; re-raise a failure here, on the caller's
        thread (once)."""
        self.join()
        error = self._writer.take_error()
        if error is not None:
            raise error

    # -- failures -------------------------------------------------------------------------------

    def handle_error(self, exc: TransactionError) -> None:
        """Abort the open transaction (or give up on the producer); InfrastructureError when
        the member must end (fenced by another member with its transactional id)."""
        self.join()  # the producer is the writer's while it runs
        pending = self._writer.take_error()
        if pending is not None and pending is not exc:  # the same outage: one rebuild for both
            log.debug("a queued transaction failed as well: %s", one_line(pending))
        self.metrics.transactions.labels(result="aborted").inc()
        if isinstance(exc, StuckCallError):
            log.warning("%s: abandoning the producer, rewinding to the committed offsets", exc)
            self.wedged = True
            return
        if (refused := self.refusal(exc)) is not None:
            self.wedged = True
            raise refused from exc
        error = kafka_error(exc)
        if error is not None and error.code() in FENCED_CODES:
            self.wedged = True  # no abort on a fenced producer: it is unusable
            raise InfrastructureError(
                f"fenced: another member uses the transactional id "
                f"{self.transactional_id!r} ({one_line(exc)})"
            ) from exc
        raise_if_denied(exc)
        if self.reinit_after_indefinite and _indefinite(exc):
            self._reinit_after(exc)
            return
        if error is not None and error.fatal():
            log.warning("fatal producer error (%s): replacing the producer, rewinding", error)
            self.wedged = True
            return
        if error is not None and error.txn_requires_abort():
            log.warning("transaction aborted (%s): rewinding to the committed offsets", error)
        elif error is not None and error.retriable():
            log.warning("retriable transaction error (%s): aborting and retrying the step", error)
        else:  # librdkafka: treat an error that is none of the three as fatal
            log.warning("transaction failed (%s): replacing the producer, rewinding", exc)
            self.wedged = True
            return
        self.abort_quietly()

    def _reinit_after(self, exc: TransactionError) -> None:
        """The call timed out: it may still land on the broker, under this producer's epoch,
        inside a later transaction. Abort, then replace the producer: the new one's
        init_transactions bumps the epoch, which fences whatever the old epoch has in flight
        (the client-side defence Jepsen recommends; KIP-890's per-transaction epoch bump needs
        a client that librdkafka is not yet)."""
        log.warning(
            "%s: the outcome is unknown (the request may still land); re-initialising the "
            "producer (epoch bump) before the next transaction",
            one_line(exc),
        )
        self.abort_quietly()
        self.reinits += 1
        self.wedged = True
        self._retiring = True

    def abort_quietly(self) -> bool:
        """Abort the open transaction; a producer that cannot abort is replaced later. True
        when a transaction was open and is now aborted."""
        producer = self.producer
        if producer is None or self.wedged or self._needs_init:
            return False  # nothing to abort on a producer without transactions yet
        timeout = self.closing_timeout_s or self.kafka_timeout_s
        try:
            self._calls.bounded(
                "abort_transaction", lambda: producer.abort_transaction(timeout), timeout
            )
            return True
        except StuckCallError as exc:
            log.warning("%s: the producer will be replaced", exc)
            self.wedged = True
        except KafkaException as exc:
            error = kafka_error(exc)
            if error is not None and error.code() == KafkaError._STATE:
                log.debug("abort_transaction: %s", exc)  # no transaction was open
                return False
            log.warning("abort_transaction failed (%s): the producer will be replaced", exc)
            self.wedged = True
        return False


def _indefinite(exc: BaseException) -> bool:
    """A timeout whose request may still land: its outcome is unknown (INDEFINITE_CODES)."""
    error = kafka_error(exc)
    return error is not None and error.code() in INDEFINITE_CODES
