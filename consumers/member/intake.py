"""The member's consumer: what comes in, and when (poll, decode while polling, pause, rebalances).
Reasons: docs/operating.md, "A step and its transaction"."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)

from codeclog.consumers.member.metrics import VocoderMetrics
from codeclog.consumers.member.refusals import Refusals
from codeclog.kafka.calls import (
    KAFKA_LOG,
    ClusterUnavailableError,
    InfrastructureError,
    one_line,
)
from codeclog.kafka.reader import input_record
from codeclog.kafka.records import InputRecord

Decoded = TypeVar("Decoded")  # what a step hands back from the decode thread


class Hooks(Protocol):
    """What the member does when partitions come and go (never raising into librdkafka): the
    rebalance callbacks hand the partitions over once the decode in flight ended."""

    def assigned(self, partitions: list[TopicPartition]) -> None: ...

    def revoked(self, partitions: list[TopicPartition]) -> None: ...


@dataclasses.dataclass(frozen=True)
class IntakeConfig:
    """The consumer's knobs (from VocodeConfig)."""

    group: str
    topic: str
    max_records: int
    poll_timeout_s: float
    max_poll_interval_ms: int
    kafka_timeout_s: float


class Intake:
    """One consumer-group member's consumer, its pending batch and its paused partitions."""

    def __init__(
        self,
        client_config: dict[str, str],
        config: IntakeConfig,
        metrics: VocoderMetrics,
        refusals: Refusals,
        hooks: Hooks,
    ) -> None:
        self.client_config = client_config
        self.config = config
        self.metrics = metrics
        self.refusals = refusals
        self.hooks = hooks
        self.consumer: Consumer | None = None
        self.pauses = 0
        self._decoding: threading.Thread | None = None  # this step's decode, while it runs
        self._void_step = False  # the assignment changed during this step's decode
        self._pending: list[InputRecord] = []  # polled while a step decoded: the next batch
        self._paused: set[tuple[str, int]] = set()  # paused by a decode, not resumed yet
        self._closing = False  # close() is leaving the group

    # -- life -----------------------------------------------------------------------------------

    def start(self) -> None:
        self.consumer = Consumer(self._consumer_config())
        self.consumer.subscribe(
            [self.config.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._join_decode()
        if self._closing:  # an assignment served by close: the member is leaving, nothing
            return  # is read from these partitions, their state is not rebuilt
        self.hooks.assigned(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._join_decode()
        self.hooks.revoked(partitions)

    def close(self, bounded_close: Callable[[Callable[[], None]], None]) -> None:
        """Leave the group; `bounded_close(consumer.close)` bounds the call. The rebalance
        callbacks librdkafka serves inside close find the consumer still there (a CI run: an
        assignment served by close asked a consumer already dropped for its committed offsets,
        and the member logged an AssertionError's traceback on its way out)."""
        consumer = self.consumer
        if consumer is None:
            return
        self._closing = True
        try:
            bounded_close(consumer.close)
        finally:
            self.consumer = None

    def _consumer_config(self) -> dict[str, Any]:
        config: dict[str, Any] = dict(self.client_config)
        config.setdefault("logger", KAFKA_LOG)
        config.update(
            {
                "group.id": self.config.group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "partition.assignment.strategy": "cooperative-sticky",
                "max.poll.interval.ms": self.config.max_poll_interval_ms,
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 1_000,
            }
        )
        return config

    # -- records --------------------------------------------------------------------------------

    def poll(self) -> list[InputRecord]:
        """The next batch: what was polled while the last step decoded, else a fetch."""
        if self._pending:
            records, self._pending = self._pending, []
            return records
        consumer = self._consumer()
        self._resume_paused()
        try:
            return self._records(self._fetched(consumer))
        except KafkaException as exc:
            raise InfrastructureError(f"consume failed: {exc}") from exc

    def forget_pending(self) -> None:
        """After a rewind: what was polled is read again from the committed offsets."""
        self._pending.clear()

    def _records(self, messages: list[Message]) -> list[InputRecord]:
        doing = self.refusals.doing
        return [
            record
            for m in messages
            if (record := input_record(m, self.client_config, doing)) is not None
        ]

    def _fetched(self, consumer: Consumer) -> list[Message]:
        """Up to max_records records without waiting for a full batch: what is already fetched
        is taken at once; only an empty queue waits (poll_timeout_s) for the first record.
        (`consume(n, timeout)` alone waits the whole timeout unless n records are there, which
        put up to poll_timeout_s on every chunk's latency at low load.)"""
        limit = self.config.max_records
        messages: list[Message] = consumer.consume(limit, 0)
        if messages:
            return messages
        messages = consumer.consume(1, self.config.poll_timeout_s)
        if messages and limit > 1:
            messages.extend(consumer.consume(limit - 1, 0))
        return messages

    # -- decoding while polling -----------------------------------------------------------------

    def decode(self, step: Callable[[], Decoded]) -> Decoded | None:
        """`step()` on a worker thread while this thread keeps polling (`_poll_while`). None
        when the assignment changed meanwhile (the step is void)."""
        outcome: list[Decoded | BaseException] = []

        def run() -> None:
            try:
                outcome.append(step())
            except BaseException as exc:  # handed to this thread, raised here
                outcome.append(exc)

        worker = threading.Thread(target=run, name="codeclog-decode", daemon=True)
        self._void_step = False
        self._decoding = worker
        try:
            worker.start()
            self._poll_while(worker)
            worker.join()
        finally:
            self._decoding = None
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return None if self._void_step else result

    def _poll_while(self, worker: threading.Thread) -> None:
        """Until `worker` ends, poll: new records become the next step's batch, rebalance
        callbacks run (they wait for the decode and void the step), and the member stays well
        within max.poll.interval.ms however long the device works. Once a whole batch is
        waiting the decoder is saturated: the assignment is paused (nothing more is fetched or
        buffered) until the step ends, then what is still ours resumes."""
        consumer = self._consumer()
        paused: list[TopicPartition] = []
        try:
            # wait on the decode, never in librdkafka: a fast decode must not wait for a poll
            while True:
                worker.join(self.config.poll_timeout_s)
                if not worker.is_alive():
                    break
                room = self.config.max_records - len(self._pending)
                if room > 0:
                    self._pending += self._records(consumer.consume(room, 0))
                    continue
                if not paused:
                    paused = self._pause(consumer)
                message = consumer.poll(0)  # callbacks; a record of a partition assigned
                if message is not None:  # meanwhile joins the batch (the rebalance voids)
                    self._pending += self._records([message])
        except KafkaException as exc:
            raise InfrastructureError(f"consume failed: {exc}") from exc
        finally:
            if paused:
                self._resume_paused()
                self.metrics.paused_partitions.set(0)

    def _pause(self, consumer: Consumer) -> list[TopicPartition]:
        paused: list[TopicPartition] = consumer.assignment()
        consumer.pause(paused)
        self._paused.update((tp.topic, tp.partition) for tp in paused)
        self.pauses += 1
        self.metrics.pauses.inc()
        self.metrics.paused_partitions.set(len(paused))
        return paused

    def _resume_paused(self) -> None:
        """Resume every partition a decode paused that is ours now. librdkafka keeps a
        partition's pause across its revocation and re-assignment, so one revoked or lost while
        paused and given back later stayed paused for good: no records, no error (the stall
        after a leader's SIGKILL, when the member's session expired during a decode). Those
        stay here until they are ours again (`poll` resumes them)."""
        if not self._paused:
            return
        consumer = self._consumer()
        ours = [tp for tp in consumer.assignment() if (tp.topic, tp.partition) in self._paused]
        if ours:
            consumer.resume(ours)
            self._paused.difference_update((tp.topic, tp.partition) for tp in ours)

    def _join_decode(self) -> None:
        """Inside a rebalance callback while a step decodes (`_poll_while`): let the decode
        finish before the pipeline changes, and void the step (the member then rewinds)."""
        if self._decoding is not None:
            self._decoding.join()
            self._void_step = True

    # -- offsets --------------------------------------------------------------------------------

    def assignment(self) -> list[TopicPartition]:
        return list(self._consumer().assignment())

    def positions(self) -> list[TopicPartition]:
        """What the step consumed so far: taken before the next poll moves it."""
        consumer = self._consumer()
        positions = consumer.position(consumer.assignment())
        return [tp for tp in positions if tp.offset >= 0 and tp.offset != OFFSET_INVALID]

    def group_metadata(self) -> Any:
        return self._consumer().consumer_group_metadata()

    def committed(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        if not partitions:
            return []
        timeout = self.config.kafka_timeout_s
        try:
            return list(self._consumer().committed(partitions, timeout=timeout))
        except KafkaException as exc:
            if (refused := self.refusals.of(exc)) is not None:
                raise refused from exc
            raise ClusterUnavailableError(
                f"cannot read committed offsets: {one_line(exc)}"
            ) from exc

    def seek_to(self, committed: list[TopicPartition]) -> None:
        """Read again from the committed offsets (nothing committed: from the log start, as
        auto.offset.reset says); what was polled is dropped."""
        self._pending.clear()
        for tp in committed:
            start = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self._consumer().seek(TopicPartition(tp.topic, tp.partition, start))

    def drained(self) -> bool:
        """Every assigned partition is read up to its end (nothing committed is left)."""
        consumer = self._consumer()
        assignment = consumer.assignment()
        try:
            committed = {(tp.topic, tp.partition): tp.offset for tp in self.committed(assignment)}
        except ClusterUnavailableError:
            return False  # cannot tell: not drained
        for tp in consumer.position(assignment):
            try:
                low, high = consumer.get_watermark_offsets(
                    tp, timeout=self.config.kafka_timeout_s, cached=False
                )
            except KafkaException:
                return False
            # Nothing consumed since the assignment: the position is unset, the committed
            # offset (or the log start) is where reading would begin.
            position = tp.offset if tp.offset >= 0 else committed.get((tp.topic, tp.partition), -1)
            if max(position, low) < high:
                return False
        return True

    def _consumer(self) -> Consumer:
        assert self.consumer is not None, "the intake is not started"
        return self.consumer
