"""Overlapping transactions (`vocode --overlap-transactions`, opt-in): two transactional
producers per member, alternating per step, so step N+1 produces its audio while step N's
transaction commits.

With one producer (consumers/transaction.py) step N+1 cannot `begin_transaction` until step N's
`commit_transaction` returned, and at 100 streams that wait is most of a speculative listener's
latency (BENCHMARKS.md, issue 22). Here step N+1 begins on the other producer at once; the
order of the two (consumers/commit_order.py) keeps exactly-once:

- N+1's commit is issued only after N's commit succeeded. N+1's offsets cover N's inputs
  (positions only grow), so N+1 committed alone would drop N's audio.
- If N's commit fails (or is abandoned as stuck), N+1 is aborted too, and the service rewinds
  to the committed offsets exactly as after any abort: both steps' inputs are read again.
- A crash leaves at most both transactions open; the next incarnation's init_transactions on
  both transactional ids fences and aborts them. N+1 can never be committed without N.
- At most two transactions are in flight: step N+2 reuses N's producer, after N resolved.

Log order (recovery reads checkpoints in step order): before step N+1 produces anything, the
records of step N are acknowledged by their partition leaders (its commit thread flushes the
producer first; `begin` waits for that). Both producers write to the same partitions, so
every partition holds step N's records (audio, dead letters, checkpoints) before step N+1's:
the progress topic sees checkpoints in step order, as with one producer. The wait costs one
produce round trip, which the decode of N+1 normally hides.

The group coordinator and two producer ids (read in Apache Kafka's group coordinator,
group-coordinator/.../OffsetMetadataManager.java, the KIP-848 rewrite that Kafka 4.x runs;
the Scala GroupMetadata of 2.5-3.x keeps the same map): a TxnOffsetCommit is validated against
the consumer group metadata only (`validateTransactionalOffsetCommit`: group, member id,
generation / member epoch, KIP-447), not against the producer. Pending transactional offsets
are kept per producer id (`pendingTransactionalOffsets`, and `openTransactionsByGroup` is a
set of producer ids per group), so two producers of one member may each hold pending offsets
for the same partition. On a commit marker (`replayEndTransactionMarker`) a producer's pending
offset replaces the committed one only if its record in __consumer_offsets is newer
(`recordOffset`), so N+1's offsets (sent after N's) win even in a mixed order, and an abort
drops only that producer's pending offsets. While either has pending offsets for a partition,
an OffsetFetch with require_stable (librdkafka sets it for read_committed) answers
UNSTABLE_OFFSET_COMMIT and the client retries, so a rewind reads the offsets once both
transactions are resolved (the service resolves them first anyway: `handle_error` joins both).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from confluent_kafka import KafkaException, TopicPartition

from codeclog.consumers import kafka_calls
from codeclog.consumers.commit_order import CommitOrder, Verdict
from codeclog.consumers.kafka_calls import StuckCallError
from codeclog.consumers.metrics import VocoderMetrics
from codeclog.consumers.transaction import TransactionError, Transactions
from codeclog.errors import CodeclogError

log = logging.getLogger("codeclog.vocode")
OVERLAP_SUFFIX = "-overlap"  # the second producer's transactional id: <member id>-overlap


def overlap_ids(transactional_id: str) -> tuple[str, str]:
    """The member's two transactional ids. The first is the member's own id, so a member
    switched to this mode fences its single-producer predecessor at start."""
    return transactional_id, f"{transactional_id}{OVERLAP_SUFFIX}"


class OverlappingTransactions:
    """Two `Transactions` (one producer each) driven by a `CommitOrder`; the same interface
    the service uses for one."""

    def __init__(
        self,
        client_config: dict[str, str],
        transactional_id: str,
        transaction_timeout_ms: int,
        kafka_timeout_s: float,
        metrics: VocoderMetrics,
    ) -> None:
        self.transactional_id = transactional_id
        self.kafka_timeout_s = kafka_timeout_s
        self.slots = tuple(
            Transactions(client_config, tid, transaction_timeout_ms, kafka_timeout_s, metrics)
            for tid in overlap_ids(transactional_id)
        )
        self.order = CommitOrder(limit=len(self.slots))
        self._lock = threading.Condition()
        self._current: int | None = None  # the step being built on the service's thread
        self._threads: dict[int, threading.Thread] = {}  # step -> its commit thread
        self._delivered: dict[int, threading.Event] = {}  # step -> its records acknowledged
        self._error: tuple[int, TransactionError] | None = None  # first failure, not raised yet
        self._raised: tuple[int, TransactionError] | None = None  # raised, not yet handled

    # -- what the service sets and reads ------------------------------------------------------

    @property
    def wedged(self) -> bool:
        return any(slot.wedged for slot in self.slots)

    @wedged.setter
    def wedged(self, value: bool) -> None:
        for slot in self.slots:
            slot.wedged = value

    @property
    def closing_timeout_s(self) -> float | None:
        return self.slots[0].closing_timeout_s

    @closing_timeout_s.setter
    def closing_timeout_s(self, value: float | None) -> None:
        for slot in self.slots:
            slot.closing_timeout_s = value

    @property
    def refusal(self) -> Callable[[BaseException], CodeclogError | None]:
        return self.slots[0].refusal

    @refusal.setter
    def refusal(self, value: Callable[[BaseException], CodeclogError | None]) -> None:
        for slot in self.slots:
            slot.refusal = value

    @property
    def abandoned(self) -> int:
        return sum(slot.abandoned for slot in self.slots)

    @property
    def committing(self) -> bool:
        return bool(self._threads)

    # -- the producers --------------------------------------------------------------------------

    def start(self, retry_for_s: float, stop: threading.Event) -> None:
        """Both producers, initialised with the same retry as one (fences both ids)."""
        for slot in self.slots:
            slot.start(retry_for_s, stop)
        ids = " and ".join(slot.transactional_id for slot in self.slots)
        log.info("overlapping transactions: producers %s, alternating per step", ids)

    def ensure_producer(self, reason: str = "") -> None:
        for slot in self.slots:
            slot.ensure_producer(reason)

    def close(self) -> None:
        for slot in self.slots:
            slot.close()

    # -- one step's transaction -----------------------------------------------------------------

    def await_turn(self) -> None:
        """Before a step begins: wait until its producer's previous step is resolved (at most
        two in flight); raise a failure recorded so far (once)."""
        with self._lock:
            full = len(self.order.in_flight) >= self.order.limit
            oldest = self.order.in_flight[0] if full else None
            thread = self._threads.get(oldest) if oldest is not None else None
        if oldest is not None and thread is not None:
            self._join_step(oldest, thread)
        self._raise_recorded()

    def begin(self) -> None:
        """Begin the next step on the free producer, once the previous step's records are
        acknowledged (log order, see the module docstring)."""
        with self._lock:
            self._raise_recorded_locked()
            previous = self.order.in_flight[-1] if self.order.in_flight else None
            step = self.order.begin()
            self._current = step
        if previous is not None:
            self._await_delivered(previous)
        self._slot(step).begin()

    def produce(self, topic: str, key: str, value: bytes, partition: int | None = None) -> None:
        self._slot(self._building()).produce(topic, key, value, partition)

    def send_offsets(self, positions: list[TopicPartition], group_metadata: object) -> None:
        self._slot(self._building()).send_offsets(positions, group_metadata)

    def commit_in_background(self, on_committed: Callable[[], None]) -> None:
        """Hand the step to its commit thread: flush, wait for the earlier step's verdict,
        commit (or leave it to the abort that follows a failure)."""
        step = self._building()
        with self._lock:
            self._current = None
            if not self.order.request_commit(step):
                return  # an earlier step failed meanwhile: its error is recorded
            delivered = self._delivered[step] = threading.Event()
            thread = threading.Thread(
                target=self._commit,
                args=(step, delivered, on_committed),
                name=f"codeclog-commit-{self.order.slot(step)}",
                daemon=True,
            )
            self._threads[step] = thread
        thread.start()

    def _commit(
        self, step: int, delivered: threading.Event, on_committed: Callable[[], None]
    ) -> None:
        """On the step's commit thread. An exception other than Kafka's ends the thread with
        the step unresolved; `_join_step` then gives it up (never a commit out of order)."""
        producer = self._slot(step).producer
        assert producer is not None
        timeout = self.kafka_timeout_s
        try:
            remaining = producer.flush(timeout)  # the step's records acknowledged: log order
        except KafkaException as exc:
            self._fail(step, exc)
            return
        finally:
            delivered.set()
        if remaining > 0:
            self._fail(step, StuckCallError("flush (the step's records)", timeout))
            return
        with self._lock:
            while (verdict := self.order.verdict(step)) is None:
                self._lock.wait()
        if verdict is Verdict.ABORT:
            return  # an earlier step failed: the service aborts this one with it
        try:
            producer.commit_transaction(timeout)
        except KafkaException as exc:
            self._fail(step, exc)
            return
        with self._lock:
            # False: given up on as stuck meanwhile. Under the lock, so the next step's
            # callback (stats, metrics) runs after this one's, never at the same time.
            if self.order.committed(step):
                on_committed()
            self._lock.notify_all()

    def _fail(self, step: int, exc: TransactionError) -> None:
        with self._lock:
            if self.order.failed(step) and self._error is None:
                self._error = (step, exc)
            self._lock.notify_all()

    # -- waiting --------------------------------------------------------------------------------

    def join(self) -> None:
        """Wait for every commit in flight without raising (rebalance callbacks, shutdown);
        one still running past its timeout plus CALL_GRACE_S is stuck: given up on (which
        aborts the later step with it), recorded as the failure."""
        with self._lock:
            threads = sorted(self._threads.items())
        for step, thread in threads:
            self._join_step(step, thread)

    def await_commit(self) -> None:
        """Wait for both commits; re-raise the first failure here (once)."""
        self.join()
        self._raise_recorded()

    def _join_step(self, step: int, thread: threading.Thread) -> None:
        limit = self.kafka_timeout_s * 2 + kafka_calls.CALL_GRACE_S  # flush, then commit
        thread.join(limit)
        with self._lock:
            unresolved = step in self.order.in_flight  # stuck, or ended without an outcome
        if unresolved:
            self._fail(step, StuckCallError("commit_transaction", limit))
        with self._lock:
            self._threads.pop(step, None)
            self._delivered.pop(step, None)

    def _await_delivered(self, step: int) -> None:
        with self._lock:
            delivered = self._delivered.get(step)
        if delivered is None:
            return  # resolved and joined already
        limit = self.kafka_timeout_s + kafka_calls.CALL_GRACE_S
        if not delivered.wait(limit):
            stuck = StuckCallError("flush (the previous step's records)", limit)
            self._fail(step, stuck)  # the earlier step's producer is stuck: it is given up on
            self._raise_recorded()
        # a failure recorded now is the earlier step's (the step being built has no commit
        # yet), which has aborted the step being built with it
        self._raise_recorded()

    def _raise_recorded(self) -> None:
        with self._lock:
            self._raise_recorded_locked()

    def _raise_recorded_locked(self) -> None:
        """Raise the first recorded failure (once); `handle_error` then finds its producer."""
        if self._error is not None:
            self._raised, self._error = self._error, None
            raise self._raised[1]

    # -- failures -------------------------------------------------------------------------------

    def handle_error(self, exc: TransactionError) -> None:
        """Abort both open transactions (or give up on a producer) and let the service rewind;
        InfrastructureError when either producer is fenced (the member ends, as with one)."""
        with self._lock:
            building, self._current = self._current, None
            if building is not None:  # failed while being built: it, and nothing earlier
                self.order.failed(building)
            self._lock.notify_all()
        self.join()  # the earlier step resolves: committed, failed, or given up on
        with self._lock:
            failures = [f for f in (self._raised, self._error) if f is not None]
            self._raised = self._error = None
        owners = [self.order.slot(step) for step, failure in failures if failure is exc]
        if not owners:  # raised on the service's thread: the step being built
            owners = [self.order.slot(building) if building is not None else 0]
        try:
            self.slots[owners[0]].handle_error(exc)
            for step, failure in failures:  # both failed: a fenced one still ends the member
                if failure is not exc:
                    self.slots[self.order.slot(step)].handle_error(failure)
        finally:
            for index, slot in enumerate(self.slots):
                # the other step's transaction, if still open: aborted with it, and counted
                if index != owners[0] and slot.abort_quietly():
                    slot.metrics.transactions.labels(result="aborted").inc()
            with self._lock:
                self.order.rewound()

    def abort_quietly(self) -> bool:
        aborted = [slot.abort_quietly() for slot in self.slots]
        return any(aborted)

    # -- helpers --------------------------------------------------------------------------------

    def _building(self) -> int:
        step = self._current
        assert step is not None, "no step begun"
        return step

    def _slot(self, step: int) -> Transactions:
        return self.slots[self.order.slot(step)]
