"""The Code2Wav consumer: fold, batch-decode and write audio with exactly-once semantics.

One step = one `consume()` of up to `max_records` records, the shared AudioPipeline (fold +
batched vocoder decode), then ONE Kafka transaction that carries the audio chunks, the dead
letters, a checkpoint per touched request (compacted progress topic) and the consumed offsets.
A crash before the commit aborts everything of the step; a crash after it loses nothing.

The commit overlaps the next step: a step's transaction is committed on a helper thread while
the main thread polls and decodes the next batch, so the vocoder does not wait for the broker.
Transactions stay strictly sequential: a step begins its own transaction only after the
previous commit returned; if that commit failed, the step's decoded results are discarded and
the state is rebuilt from the log (`_rewind`), exactly as after any failed transaction.
Rebalance callbacks, the idle check and shutdown wait for the commit in flight first.

How recovery works (see also the README): vocoder state (hundreds of MB per stream on the real
model) is never snapshotted. Each transaction writes, per touched request, a small checkpoint
to the progress topic, in the partition numbered like the input partition: the fold state
(export_request), whether the stream is open, and the input offset where its current epoch
started. When a partition is assigned (start, restart after SIGKILL, rebalance), the consumer
reads that progress partition, restores the fold state of every request, and for each open
stream re-reads the input from the start of its epoch up to the committed offset, decoding
without emitting (event sourcing) to rebuild the vocoder state. Decoding is deterministic, so
the windows after the committed offset are byte-identical to an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from codeclog.config import TopicsConfig
from codeclog.errors import CodeclogError
from consumers.fold.machine import FoldConfig, Policy, export_request, import_request
from consumers.metrics import VocoderMetrics
from consumers.pipeline import (
    DEAD_LETTER_HEADROOM_BYTES,
    DEAD_LETTER_RAW_LIMIT,
    AudioPipeline,
    InputRecord,
    PipelineConfig,
    Position,
    StepOutput,
    VocoderEngine,
)
from schemas import wire
from schemas.records import SAMPLE_RATE_HZ, StreamCheckpoint

log = logging.getLogger("codeclog.vocode")
# librdkafka's own log lines (connection failures, session timeouts, ...) go to this logger,
# never straight to the terminal; `codeclog vocode -v` shows them.
KAFKA_LOG = logging.getLogger("codeclog.kafka")

DEFAULT_GROUP = "codeclog-vocoder"
EXIT_OK = 0
EXIT_INFRASTRUCTURE = 1
EXIT_STRICT_FATAL = 3
# A Kafka call given a timeout T that has not returned after T + CALL_GRACE_S is stuck (seen:
# send_offsets_to_transaction after a broker crash, long past its timeout): it is abandoned on
# its helper thread and the producer is replaced (init_transactions fences the old one).
CALL_GRACE_S = 5.0
RETRY_PAUSE_S = 1.0  # between two recovery attempts while the cluster does not answer
CLOSE_ON_FAILURE_S = 2.0  # abort, close and flush bounds once the member is exiting 1
_FENCED_NAMES = ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")
FENCED_CODES = frozenset(
    code for name in _FENCED_NAMES if (code := getattr(KafkaError, name, None)) is not None
)

T = TypeVar("T")


class InfrastructureError(CodeclogError):
    """Kafka (or the machine) failed in a way the consumer cannot repair: the process ends."""


class ClusterUnavailableError(InfrastructureError):
    """A read the recovery needs timed out: retried until the outage limit, then the end."""


class StuckCallError(CodeclogError):
    """A librdkafka call did not return within its timeout plus CALL_GRACE_S."""

    def __init__(self, what: str, waited_s: float) -> None:
        super().__init__(f"{what} did not return within {waited_s:g} s")
        self.what = what


@dataclasses.dataclass(frozen=True)
class VocodeConfig:
    """Knobs of the consumer service. Every bound is here."""

    group: str = DEFAULT_GROUP
    instance_id: str = "0"  # stable per member: a restart fences its own zombie transaction
    policy: Policy = Policy.TOLERANT
    max_records: int = 64  # records per step (and so windows per decode step)
    max_batch: int = 64  # windows per decode_batch call
    poll_timeout_s: float = 0.05
    max_open_streams: int = 1024  # cap; the least recently opened stream is evicted beyond it
    transaction_timeout_ms: int = 60_000
    max_poll_interval_ms: int = 300_000
    exit_when_idle_s: float | None = None  # tests and the demo: stop after this long idle
    rebuild_batch: int = 256
    # Liveness bounds (README, "How recovery works"). Every librdkafka call that can wait gets
    # kafka_timeout_s; one that has not returned CALL_GRACE_S later is abandoned as stuck.
    kafka_timeout_s: float = 10.0
    # After a failed transaction or call, the member aborts, rebuilds and retries; if no
    # transaction commits within outage_timeout_s of the first failure, it exits 1.
    outage_timeout_s: float = 60.0
    # After stop() (SIGTERM): if the clean stop has not finished within this long, the process
    # ends itself (exit 1, one line). None: no such watchdog (in-process library use).
    stop_timeout_s: float | None = None

    @property
    def transactional_id(self) -> str:
        return f"{self.group}-{self.instance_id}"


class VocoderService:
    """A consumer-group member running the Code2Wav stage."""

    def __init__(
        self,
        client_config: dict[str, str],
        topics: TopicsConfig,
        config: VocodeConfig,
        engine: VocoderEngine,
        metrics: VocoderMetrics | None = None,
        clock_ms: Callable[[], int] | None = None,
        stop_event: threading.Event | None = None,
    ) -> None:
        self.client_config = client_config
        self.topics = topics
        self.config = config
        self.engine = engine
        self.metrics = metrics or VocoderMetrics.create(None)
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._dead_letter_limit = DEAD_LETTER_RAW_LIMIT
        self.pipeline = self._new_pipeline()
        self._epoch_start: dict[str, int] = {}
        self._stop = stop_event or threading.Event()
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._committing: threading.Thread | None = None  # the previous step's commit
        self._commit_error: KafkaException | StuckCallError | None = None
        self._commit_generation = 0  # bumped when a stuck commit is abandoned
        self._producer_wedged = False  # a call on it got stuck or it hit a fatal error
        self._producer_needs_init = False
        self._abandoned: list[Producer] = []  # replaced producers: never destroyed (may block)
        self._failing_since: float | None = None  # first failure since the last commit
        self._last_failure_at: float | None = None
        self._last_error = ""
        self._assign_failed: BaseException | None = None  # recovery in a callback failed
        self._finished = threading.Event()
        self._closing_timeout_s: float | None = None  # set when exiting on a failure
        self._decoding: threading.Thread | None = None  # this step's decode, while it runs
        self._void_step = False  # the assignment changed during this step's decode
        self._pending: list[InputRecord] = []  # polled while a step decoded: the next batch
        self.stats: dict[str, int] = dict.fromkeys(
            ("records", "windows", "dead_letters", "steps", "pauses", "void_steps"), 0
        )

    # -- lifecycle ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the current step, commit it, and leave (SIGTERM handler)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        install_stop_handlers(self._stop)

    @property
    def abandoned_clients(self) -> int:
        """Producers given up on (stuck or fatal). The CLI ends with os._exit when > 0:
        destroying a handle with a call still inside librdkafka can block."""
        return len(self._abandoned)

    @property
    def bootstrap(self) -> str:
        return str(self.client_config.get("bootstrap.servers", "?"))

    def run(self) -> int:
        """Run until stopped. Returns the process exit code; never raises for Kafka failures."""
        if self._stop.is_set():
            return EXIT_OK
        if self.config.stop_timeout_s is not None:
            threading.Thread(target=self._stop_watchdog, name="codeclog-stop", daemon=True).start()
        try:
            self._start()
            return self._loop()
        except (InfrastructureError, StuckCallError, KafkaException) as exc:
            print(f"codeclog vocode: {_one_line(exc)}", file=sys.stderr)
            # The cluster is failing: short bounds from here on (an open transaction is aborted
            # by the next member's init_transactions, or by its timeout).
            self._closing_timeout_s = CLOSE_ON_FAILURE_S
            self._join_commit()
            self._abort_quietly()
            return EXIT_INFRASTRUCTURE
        except Exception as exc:  # a bug: still one line (the traceback is logged with -v)
            log.debug("unexpected error", exc_info=True)
            print(
                f"codeclog vocode: unexpected {type(exc).__name__}: {_one_line(exc)}",
                file=sys.stderr,
            )
            self._closing_timeout_s = CLOSE_ON_FAILURE_S
            self._join_commit()
            self._abort_quietly()
            return EXIT_INFRASTRUCTURE
        finally:
            self._join_commit()
            self._close()
            self._finished.set()

    def _stop_watchdog(self) -> None:
        """SIGTERM ends the process within stop_timeout_s, whatever is stuck."""
        while not self._stop.wait(0.5):
            if self._finished.is_set():
                return
        assert self.config.stop_timeout_s is not None
        if self._finished.wait(self.config.stop_timeout_s):
            return
        print(
            f"codeclog vocode: asked to stop, but the current step did not finish within "
            f"{self.config.stop_timeout_s:g} s (cluster at {self.bootstrap}); exiting without "
            "committing it (the next member redoes it)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_INFRASTRUCTURE)

    def _start(self) -> None:
        self._check_cluster()
        self._producer = Producer(self._producer_config())
        try:
            self._init_transactions()
        except (KafkaException, StuckCallError) as exc:
            raise InfrastructureError(
                f"cannot initialise transactions on the cluster at {self.bootstrap}: "
                f"{_one_line(exc)}"
            ) from exc
        self._consumer = Consumer(self._consumer_config())
        self._consumer.subscribe(
            [self.topics.chunks],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )

    def _check_cluster(self) -> None:
        """One metadata request first: an unreachable cluster is one line, not a minute of
        librdkafka retries."""
        from confluent_kafka.admin import AdminClient

        settings: dict[str, Any] = {**self.client_config, "logger": KAFKA_LOG}
        admin = AdminClient(settings)
        timeout = self.config.kafka_timeout_s
        try:
            metadata = self._bounded("list_topics", lambda: admin.list_topics(timeout=timeout))
        except (KafkaException, StuckCallError) as exc:
            raise InfrastructureError(
                f"no answer from the cluster at {self.bootstrap} within {timeout:g} s "
                f"({_one_line(exc)})"
            ) from exc
        if self.topics.chunks not in metadata.topics:
            log.warning("topic %s does not exist (yet) at %s", self.topics.chunks, self.bootstrap)
        self._fit_dead_letters(admin)

    def _fit_dead_letters(self, admin: Any) -> None:
        """Dead letters must fit the dead-letter topic: keep whole at most its
        max.message.bytes minus headroom (unknown: the default limit)."""
        from confluent_kafka.admin import ConfigResource

        resource = ConfigResource(ConfigResource.Type.TOPIC, self.topics.dlq)
        timeout = self.config.kafka_timeout_s
        try:
            futures = admin.describe_configs([resource], request_timeout=timeout)
            entries = self._bounded("describe_configs", lambda: futures[resource].result(timeout))
            topic_max = int(entries["max.message.bytes"].value)
        except Exception as exc:  # the topic may not exist yet: keep the default
            log.debug("max.message.bytes of %s unknown: %s", self.topics.dlq, exc)
            return
        limit = min(DEAD_LETTER_RAW_LIMIT, max(0, topic_max - DEAD_LETTER_HEADROOM_BYTES))
        if limit != self._dead_letter_limit:
            log.info(
                "dead letters keep raw values whole up to %d bytes (%s)", limit, self.topics.dlq
            )
            self._dead_letter_limit = limit
            self.pipeline = self._new_pipeline()

    def _init_transactions(self) -> None:
        producer = self._producer
        assert producer is not None
        timeout = self.config.kafka_timeout_s
        self._bounded("init_transactions", lambda: producer.init_transactions(timeout))
        self._producer_needs_init = False

    def _close(self) -> None:
        bound = self._closing_timeout_s or self.config.kafka_timeout_s
        if self._consumer is not None:
            consumer = self._consumer
            try:
                self._bounded("consumer close", consumer.close, bound)
            except (KafkaException, RuntimeError, StuckCallError) as exc:
                log.warning("consumer close failed: %s", exc)
            self._consumer = None
        if self._producer is not None:
            producer = self._producer
            if self._producer_wedged:
                self._abandoned.append(producer)
            else:
                try:
                    self._bounded("flush", lambda: producer.flush(bound), bound)
                except (KafkaException, StuckCallError) as exc:
                    log.warning("producer flush failed: %s", _one_line(exc))
                    self._abandoned.append(producer)
            self._producer = None

    def _bounded(self, what: str, call: Callable[[], T], timeout_s: float | None = None) -> T:
        """`call()` on a helper thread; StuckCallError if it has not returned within the
        Kafka timeout plus CALL_GRACE_S (the helper is then abandoned). The waiting thread
        stays responsive: signal handlers run, a stuck librdkafka call cannot hold it."""
        limit = (self.config.kafka_timeout_s if timeout_s is None else timeout_s) + CALL_GRACE_S
        box: list[tuple[bool, Any]] = []

        def target() -> None:
            try:
                box.append((True, call()))
            except BaseException as exc:  # handed to the waiting thread, raised there
                box.append((False, exc))

        worker = threading.Thread(target=target, name=f"codeclog-{what}", daemon=True)
        worker.start()
        worker.join(limit)
        if worker.is_alive() or not box:
            raise StuckCallError(what, limit)
        ok, value = box[0]
        if not ok:
            raise value
        result: T = value
        return result

    def _producer_config(self) -> dict[str, Any]:
        config = transactional_producer_config(
            self.client_config, self.config.transactional_id, self.config.transaction_timeout_ms
        )
        config.setdefault("logger", KAFKA_LOG)
        return config

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

    def _new_pipeline(self) -> AudioPipeline:
        pipeline_config = PipelineConfig(
            fold=FoldConfig(policy=self.config.policy),
            per_partition=True,
            max_batch=self.config.max_batch,
            producer_id=self.config.transactional_id,
            dead_letter_raw_limit=self._dead_letter_limit,
        )
        return AudioPipeline(pipeline_config, self.engine, self._clock_ms)

    # -- the loop -------------------------------------------------------------------------------

    def _loop(self) -> int:
        idle_since = time.monotonic()
        while not self._stop.is_set():
            records = self._poll()
            if not records:
                if not self._has_assignment():
                    idle_since = time.monotonic()  # idle means "assigned and nothing to do"
                    continue
                limit = self.config.exit_when_idle_s
                if limit is not None and time.monotonic() - idle_since > limit:
                    if self._drained():
                        log.info("idle for %.1f s with nothing left to read: stopping", limit)
                        break
                    idle_since = time.monotonic()
                continue
            idle_since = time.monotonic()
            out = self._step(records)
            if out.fatal is not None:
                self._settle()
                return self._strict_fatal(out)
        self._settle()
        return EXIT_OK

    def _has_assignment(self) -> bool:
        assert self._consumer is not None
        return bool(self._consumer.assignment())

    def _drained(self) -> bool:
        """Every assigned partition is read up to its end (nothing committed is left)."""
        assert self._consumer is not None
        self._settle()
        assignment = self._consumer.assignment()
        try:
            committed = {(tp.topic, tp.partition): tp.offset for tp in self._committed(assignment)}
        except ClusterUnavailableError:
            return False  # cannot tell: not drained
        for tp in self._consumer.position(assignment):
            try:
                low, high = self._consumer.get_watermark_offsets(
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

    def _poll(self) -> list[InputRecord]:
        if self._pending:  # polled while the previous step decoded
            records, self._pending = self._pending, []
            return records
        assert self._consumer is not None
        try:
            messages = self._fetched(self._consumer)
        except KafkaException as exc:
            raise InfrastructureError(f"consume failed: {exc}") from exc
        if self._assign_failed is not None:  # partitions came without their state: rebuild
            failure, self._assign_failed = self._assign_failed, None
            self._settle()
            self._rebuild_after(failure)
            return []
        return self._records(messages)

    def _records(self, messages: list[Message]) -> list[InputRecord]:
        return [record for m in messages if (record := self._record(m)) is not None]

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

    @staticmethod
    def _record(message: Message) -> InputRecord | None:
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return None
            if error.fatal():
                raise InfrastructureError(f"consumer error: {error}")
            log.warning("consumer error: %s", error)
            return None
        _, timestamp_ms = message.timestamp()
        position = Position(
            message.topic() or "", message.partition() or 0, message.offset() or 0, timestamp_ms
        )
        return InputRecord(position, message.key(), message.value() or b"")

    def _step(self, records: Sequence[InputRecord]) -> StepOutput:
        try:
            return self._transaction(records)
        except (KafkaException, StuckCallError) as exc:
            self._recover_from(exc)
            return StepOutput()

    def _recover_from(self, exc: KafkaException | StuckCallError) -> None:
        """A transaction failed (this step's or the previous): abort, rebuild from the log."""
        self._handle_transaction_error(exc)
        self._rebuild_after(exc)

    def _rebuild_after(self, exc: BaseException) -> None:
        """Rewind to the committed offsets, retrying while the cluster does not answer, until
        outage_timeout_s after the first failure (then InfrastructureError: exit 1)."""
        self._note_failure(exc)
        while True:
            try:
                self._ensure_producer()
                self._rewind()
                return
            except (KafkaException, StuckCallError, ClusterUnavailableError) as again:
                if isinstance(again, StuckCallError):
                    self._producer_wedged = True
                log.warning("recovery failed (%s): retrying", _one_line(again))
                self._note_failure(again)
                if self._stop.wait(RETRY_PAUSE_S):
                    raise InfrastructureError(
                        f"stopped while the cluster at {self.bootstrap} did not answer "
                        f"({self._last_error}); the uncommitted step is redone by the next member"
                    ) from again

    def _note_failure(self, exc: BaseException) -> None:
        """Count a failure towards the outage limit. The clock runs from the first failure
        since the last commit; a failure long after the previous one (an idle member that
        commits nothing) starts it again."""
        now = time.monotonic()
        quiet_since = self._last_failure_at
        if quiet_since is not None and now - quiet_since > self.config.outage_timeout_s:
            self._failing_since = None
        self._last_failure_at = now
        if self._failing_since is None:
            self._failing_since = now
        self._last_error = _one_line(exc)
        failing_s = now - self._failing_since
        if failing_s > self.config.outage_timeout_s:
            raise InfrastructureError(
                f"no transaction committed for {failing_s:.0f} s: the cluster at "
                f"{self.bootstrap} keeps failing ({self._last_error}); giving up (the next "
                "member resumes from the committed offsets)"
            )

    def _ensure_producer(self) -> None:
        """Replace a wedged producer (same transactional id: init_transactions fences the
        old one and aborts its open transaction); finish a pending init_transactions."""
        if self._producer is None or self._producer_wedged:
            if self._producer is not None:
                log.warning("replacing the transactional producer (%s)", self._last_error)
                self._abandoned.append(self._producer)  # never destroyed: it may be stuck
            self._producer = Producer(self._producer_config())
            self._producer_wedged = False
            self._producer_needs_init = True
        if self._producer_needs_init:
            try:
                self._init_transactions()
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.fatal():
                    self._producer_wedged = True
                raise

    def _transaction(self, records: Sequence[InputRecord]) -> StepOutput:
        assert self._producer is not None and self._consumer is not None
        started = time.perf_counter()
        positions = self._positions()  # what this step consumed; taken before the next poll
        out = self._decode(records)  # decodes while the previous commit is in flight
        if out is None:  # a rebalance happened meanwhile: the step is void, start over
            self.stats["void_steps"] += 1
            try:
                self._await_commit()
            except (KafkaException, StuckCallError) as exc:  # the one rebuild below
                self._handle_transaction_error(exc)
                self._rebuild_after(exc)
                return StepOutput()
            self._rewind()
            return StepOutput()
        self.pipeline.evict_oldest(out, self.config.max_open_streams)
        self._await_commit()  # raises if it failed: this step's results are then discarded
        self._note_epoch_starts(out)
        self._producer.begin_transaction()
        for chunk in out.audio:
            self._produce(self.topics.audio, chunk.request_id, wire.encode(chunk))
        for letter in out.dead_letters:
            self._produce(self.topics.dlq, letter.request_id or "", wire.encode(letter))
        for checkpoint, partition in self._checkpoints(out, records):
            value = wire.encode(checkpoint)
            key = progress_key(self.config.group, checkpoint.request_id)
            self._produce(self.topics.progress, key, value, partition)
        producer, metadata = self._producer, self._consumer.consumer_group_metadata()
        timeout = self.config.kafka_timeout_s
        self._bounded(
            "send_offsets_to_transaction",
            lambda: producer.send_offsets_to_transaction(positions, metadata, timeout),
        )
        self.metrics.open_streams.set(self.pipeline.open_streams())
        self._committing = threading.Thread(
            target=self._commit, args=(out, started), name="codeclog-commit", daemon=True
        )
        self._committing.start()
        return out

    def _decode(self, records: Sequence[InputRecord]) -> StepOutput | None:
        """`pipeline.step(records)` on a worker thread while this thread keeps polling
        (`_poll_while_decoding`). None when the assignment changed meanwhile."""
        outcome: list[StepOutput | BaseException] = []
        worker = threading.Thread(
            target=self._run_step, args=(records, outcome), name="codeclog-decode", daemon=True
        )
        self._void_step = False
        self._decoding = worker
        try:
            worker.start()
            self._poll_while_decoding(worker)
            worker.join()
        finally:
            self._decoding = None
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return None if self._void_step else result

    def _run_step(
        self, records: Sequence[InputRecord], outcome: list[StepOutput | BaseException]
    ) -> None:
        try:
            outcome.append(self.pipeline.step(records))
        except BaseException as exc:  # handed to the main thread, raised there
            outcome.append(exc)

    def _poll_while_decoding(self, worker: threading.Thread) -> None:
        """Until `worker` ends, poll: new records become the next step's batch, rebalance
        callbacks run (they wait for the decode and void the step), and the member stays well
        within max.poll.interval.ms however long the device works. Once a whole batch is
        waiting the decoder is saturated: the assignment is paused (nothing more is fetched or
        buffered) until the step ends, then what is still ours resumes."""
        assert self._consumer is not None
        consumer = self._consumer
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
                    paused = consumer.assignment()
                    consumer.pause(paused)
                    self.stats["pauses"] += 1
                    self.metrics.pauses.inc()
                    self.metrics.paused_partitions.set(len(paused))
                message = consumer.poll(0)  # callbacks; a record of a partition assigned
                if message is not None:  # meanwhile joins the batch (the rebalance voids)
                    self._pending += self._records([message])
        except KafkaException as exc:
            raise InfrastructureError(f"consume failed: {exc}") from exc
        finally:
            if paused:
                ours = {(tp.topic, tp.partition) for tp in consumer.assignment()}
                consumer.resume([tp for tp in paused if (tp.topic, tp.partition) in ours])
                self.metrics.paused_partitions.set(0)

    def _commit(self, out: StepOutput, started: float) -> None:
        """The commit thread: commit the open transaction, then account for the step."""
        assert self._producer is not None
        generation = self._commit_generation
        try:
            self._producer.commit_transaction(self.config.kafka_timeout_s)
        except KafkaException as exc:
            if generation == self._commit_generation:
                self._commit_error = exc
            return
        if generation != self._commit_generation:  # abandoned as stuck: it no longer counts
            return
        self._failing_since = None
        self._observe(out, time.perf_counter() - started)

    def _await_commit(self) -> None:
        """Wait for the previous step's commit; re-raise its failure here, on the main thread."""
        self._join_commit()
        error, self._commit_error = self._commit_error, None
        if error is not None:
            raise error

    def _settle(self) -> None:
        """Wait for the commit in flight and handle its failure (before rebalances, idle checks
        and shutdown, which all read or hand over committed state)."""
        try:
            self._await_commit()
        except (KafkaException, StuckCallError) as exc:
            self._recover_from(exc)

    def _produce(self, topic: str, key: str, value: bytes, partition: int | None = None) -> None:
        assert self._producer is not None
        kwargs: dict[str, Any] = {"key": key.encode(), "value": value}
        if partition is not None:
            kwargs["partition"] = partition
        deadline = time.monotonic() + self.config.kafka_timeout_s
        while True:
            try:
                self._producer.produce(topic, **kwargs)
                return
            except BufferError:  # local queue full: let deliveries drain, then retry
                if time.monotonic() > deadline:
                    limit = self.config.kafka_timeout_s
                    raise StuckCallError("produce (local queue full)", limit) from None
                self._producer.poll(0.05)

    def _positions(self) -> list[TopicPartition]:
        assert self._consumer is not None
        positions = self._consumer.position(self._consumer.assignment())
        return [tp for tp in positions if tp.offset >= 0 and tp.offset != OFFSET_INVALID]

    def _note_epoch_starts(self, out: StepOutput) -> None:
        self._epoch_start.update(out.epoch_starts)

    def _checkpoints(
        self, out: StepOutput, records: Sequence[InputRecord]
    ) -> list[tuple[StreamCheckpoint, int]]:
        last_offset: dict[str, int] = {}
        for record in records:
            if record.key is not None:
                last_offset[record.key.decode("utf-8", "replace")] = record.position.offset
        now_ms = self._clock_ms()
        result = []
        for rid, partition in out.touched.items():
            if not rid:
                continue
            checkpoint = self._checkpoint(rid, partition, last_offset.get(rid, -1), now_ms)
            result.append((checkpoint, partition))
        return result

    def _checkpoint(
        self, rid: str, partition: int, last_offset: int, now_ms: int
    ) -> StreamCheckpoint:
        exported = export_request(self.pipeline.fold_state(partition), rid)
        is_open = bool(exported and exported["open"])
        if not is_open:
            self._epoch_start.pop(rid, None)
        return StreamCheckpoint(
            request_id=rid,
            input_topic=self.topics.chunks,
            input_partition=partition,
            open=is_open,
            cache_epoch=int(exported["epoch"]) if exported else -1,
            epoch_start_offset=self._epoch_start.get(rid, -1) if is_open else -1,
            last_offset=last_offset,
            windows_emitted=self.pipeline.windows_emitted(rid),
            samples_emitted=self.pipeline.samples_emitted(rid),
            fold_state_json=json.dumps(exported, sort_keys=True) if exported else "",
            updated_at_ms=now_ms,
            producer_id=self.config.transactional_id,
            consumer_group=self.config.group,
            determinism_domain=self.pipeline.domain,
        )

    def _observe(self, out: StepOutput, step_s: float) -> None:
        now_ms = self._clock_ms()
        m = self.metrics
        m.records.inc(out.records)
        m.windows.inc(len(out.audio))
        m.transactions.labels(result="committed").inc()
        for size in out.batch_sizes:
            m.batch_size.observe(size)
        m.decode_seconds.observe(out.decode_s)
        audio_s = sum(len(c.pcm_s16le) // 2 for c in out.audio) / SAMPLE_RATE_HZ
        if audio_s > 0:
            m.rtf.set(out.decode_s / audio_s)
        for letter in out.dead_letters:
            m.rejections.labels(reason=letter.reason).inc()
        for chunk in out.audio:
            if chunk.source_produced_at_ms > 0:
                m.end_to_end_seconds.observe(max(0, now_ms - chunk.source_produced_at_ms) / 1000)
        self.stats["records"] += out.records
        self.stats["windows"] += len(out.audio)
        self.stats["dead_letters"] += len(out.dead_letters)
        self.stats["steps"] += 1
        log.debug("step: %d records, %d windows in %.3f s", out.records, len(out.audio), step_s)

    # -- failures -------------------------------------------------------------------------------

    def _handle_transaction_error(self, exc: KafkaException | StuckCallError) -> None:
        """Abort the open transaction (or give up on the producer); InfrastructureError when
        the member must end (fenced by another member with its transactional id)."""
        self.metrics.transactions.labels(result="aborted").inc()
        if isinstance(exc, StuckCallError):
            log.warning("%s: abandoning the producer, rewinding to the committed offsets", exc)
            self._producer_wedged = True
            return
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() in FENCED_CODES:
            self._producer_wedged = True  # no abort on a fenced producer: it is unusable
            raise InfrastructureError(
                f"fenced: another member uses the transactional id "
                f"{self.config.transactional_id!r} ({_one_line(exc)})"
            ) from exc
        if isinstance(error, KafkaError) and error.fatal():
            log.warning("fatal producer error (%s): replacing the producer, rewinding", error)
            self._producer_wedged = True
            return
        if isinstance(error, KafkaError) and error.txn_requires_abort():
            log.warning("transaction aborted (%s): rewinding to the committed offsets", error)
        elif isinstance(error, KafkaError) and error.retriable():
            log.warning("retriable transaction error (%s): aborting and retrying the step", error)
        else:  # librdkafka: treat an error that is none of the three as fatal
            log.warning("transaction failed (%s): replacing the producer, rewinding", exc)
            self._producer_wedged = True
            return
        self._abort_quietly()

    def _abort_quietly(self) -> None:
        """Abort the open transaction; a producer that cannot abort is replaced later."""
        producer = self._producer
        if producer is None or self._producer_wedged:
            return
        timeout = self._closing_timeout_s or self.config.kafka_timeout_s
        try:
            self._bounded("abort_transaction", lambda: producer.abort_transaction(timeout), timeout)
        except StuckCallError as exc:
            log.warning("%s: the producer will be replaced", exc)
            self._producer_wedged = True
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError._STATE:
                log.debug("abort_transaction: %s", exc)  # no transaction was open
                return
            log.warning("abort_transaction failed (%s): the producer will be replaced", exc)
            self._producer_wedged = True

    def _rewind(self) -> None:
        """After an aborted step: rebuild all state from the log as after a fresh assignment."""
        assert self._consumer is not None
        assignment = self._consumer.assignment()
        self.pipeline = self._new_pipeline()
        self._epoch_start.clear()
        self._pending.clear()  # read again from the committed offsets
        committed = self._committed(assignment)
        self._recover_all(committed)
        for tp in committed:
            # nothing committed yet: from the start, as auto.offset.reset says
            start = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self._consumer.seek(TopicPartition(tp.topic, tp.partition, start))
        self._assign_failed = None  # every assigned partition is rebuilt now

    def _strict_fatal(self, out: StepOutput) -> int:
        assert out.fatal is not None
        from consumers.fold.report import strict_error_json

        print(
            "codeclog vocode: strict policy: the upstream stage would have died here: "
            f"MiniCPMO45Code2WavBatchError {strict_error_json(out.fatal)} "
            f"(request {out.fatal.request_id!r}, epoch {out.fatal.cache_epoch}, "
            f"seq {out.fatal.chunk_seq}); later records stay unprocessed",
            file=sys.stderr,
        )
        return EXIT_STRICT_FATAL

    # -- rebalance and recovery -----------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._join_decode()
        self._join_commit()
        try:
            self._recover_all(self._committed(partitions))
        except (ClusterUnavailableError, KafkaException, StuckCallError) as exc:
            # Never raise out of a librdkafka callback: the loop rebuilds every partition
            # before it processes a record (`_poll`).
            log.warning("partition recovery failed (%s): rebuilding", _one_line(exc))
            self._assign_failed = exc

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._join_decode()
        self._join_commit()  # hand over committed work only
        for tp in partitions:
            self.pipeline.drop_partition(tp.partition)

    def _join_decode(self) -> None:
        """Inside a rebalance callback while a step decodes (`_poll_while_decoding`): let the
        decode finish before the pipeline changes, and void the step (the loop then rewinds)."""
        if self._decoding is not None:
            self._decoding.join()
            self._void_step = True

    def _join_commit(self) -> None:
        """Inside a rebalance callback: wait for the commit in flight without raising; a failure
        stays recorded and the main loop rewinds at its next step. A commit still running after
        its timeout plus CALL_GRACE_S is stuck: abandoned, recorded as the failure."""
        if self._committing is not None:
            limit = self.config.kafka_timeout_s + CALL_GRACE_S
            self._committing.join(limit)
            if self._committing.is_alive():
                self._commit_generation += 1  # whatever it does later no longer counts
                self._commit_error = StuckCallError("commit_transaction", limit)
            self._committing = None

    def _committed(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        if not partitions:
            return []
        assert self._consumer is not None
        try:
            return list(self._consumer.committed(partitions, timeout=self.config.kafka_timeout_s))
        except KafkaException as exc:
            raise ClusterUnavailableError(
                f"cannot read committed offsets: {_one_line(exc)}"
            ) from exc

    def _recover_all(self, committed: list[TopicPartition]) -> None:
        """Restore the state of assigned partitions: one read of their progress partitions
        (a reader per partition cost ~0.6 s each), then each partition's open streams."""
        started = time.monotonic()
        ours = [tp.partition for tp in committed if tp.offset >= 0]
        fresh = sorted(tp.partition for tp in committed if tp.offset < 0)
        if fresh:  # this group never committed there: nothing of ours to restore
            log.info(
                "partitions %s: no checkpoint (group %s has committed nothing there): "
                "starting at the log start",
                fresh,
                self.config.group,
            )
        checkpoints = self._read_checkpoints(ours)
        for tp in committed:
            if tp.offset >= 0:
                self._recover(tp, checkpoints.get(tp.partition, {}))
        log.info(
            "partitions %s assigned: state restored in %.2f s",
            sorted(tp.partition for tp in committed),
            time.monotonic() - started,
        )

    def _recover(self, tp: TopicPartition, checkpoints: dict[str, StreamCheckpoint]) -> None:
        """One partition with a committed offset: restore its requests' fold states, rebuild
        the vocoder states of its open streams."""
        fold_state = self.pipeline.fold_state(tp.partition)
        open_starts: dict[str, int] = {}
        for rid, checkpoint in checkpoints.items():
            if checkpoint.fold_state_json:
                import_request(fold_state, rid, json.loads(checkpoint.fold_state_json))
            if checkpoint.open and checkpoint.epoch_start_offset >= 0:
                open_starts[rid] = checkpoint.epoch_start_offset
        if open_starts and tp.offset >= 0:
            self._rebuild(tp, open_starts, checkpoints)
        self._epoch_start.update(open_starts)
        log.info(
            "partition %d: restored %d requests, rebuilt %d open streams up to offset %d",
            tp.partition,
            len(checkpoints),
            len(open_starts),
            tp.offset,
        )

    def _read_checkpoints(self, partitions: list[int]) -> dict[int, dict[str, StreamCheckpoint]]:
        """This group's newest checkpoint per request, per progress partition. v2 records name
        their group; a v1 record (no group: every group shared them) counts only when one of
        this group's members wrote it (producer id `<group>-<instance>`)."""
        if not partitions:
            return {}
        by_partition = read_partitions(
            self.client_config, self.topics.progress, partitions, self.config.kafka_timeout_s
        )
        mine = f"{self.config.group}-"
        result: dict[int, dict[str, StreamCheckpoint]] = {}
        for partition, records in by_partition.items():
            latest = result.setdefault(partition, {})
            for record in records:
                if not record.value:
                    continue
                try:
                    checkpoint = wire.decode(record.value)
                except wire.DecodeError as exc:
                    log.warning("progress record at %s: %s", record.position, exc)
                    continue
                if not isinstance(checkpoint, StreamCheckpoint):
                    continue
                group = checkpoint.consumer_group
                if group != self.config.group and (
                    group or not checkpoint.producer_id.startswith(mine)
                ):
                    continue
                latest[checkpoint.request_id] = checkpoint
        return result

    def _rebuild(
        self,
        tp: TopicPartition,
        open_starts: dict[str, int],
        checkpoints: dict[str, StreamCheckpoint],
    ) -> None:
        scratch = AudioPipeline(
            dataclasses.replace(self.pipeline.config, per_partition=True), self.engine
        )
        wanted = {rid.encode(): start for rid, start in open_starts.items()}
        start = min(open_starts.values())
        batch: list[InputRecord] = []
        for record in read_partition(
            self.client_config, self.topics.chunks, tp.partition, start, tp.offset
        ):
            begin = wanted.get(record.key or b"")
            if begin is not None and record.position.offset >= begin:
                batch.append(record)
            if len(batch) >= self.config.rebuild_batch:
                scratch.step(batch, emit=False)
                batch = []
        if batch:
            scratch.step(batch, emit=False)
        self._check_domains(list(open_starts), checkpoints)
        for rid in open_starts:
            rebuilt = scratch.windows_emitted(rid)
            expected = checkpoints[rid].windows_emitted
            if rebuilt != expected:
                log.warning(
                    "request %s: rebuilt %d windows, checkpoint says %d", rid, rebuilt, expected
                )
        self.pipeline.adopt_streams(scratch, list(open_starts), tp.partition)
        self.metrics.recoveries.inc(len(open_starts))

    def _check_domains(self, rids: list[str], checkpoints: dict[str, StreamCheckpoint]) -> None:
        """A stream rebuilt in another determinism domain than the one that decoded it so far
        continues with audio that differs from an uninterrupted run in the low bits: said in
        the log and counted (README, "How recovery works"). Portable members never differ."""
        for rid in rids:
            written = checkpoints[rid].determinism_domain
            if written and written != self.pipeline.domain:
                log.warning(
                    "request %s: checkpoint domain %s, rebuilding in domain %s: the audio "
                    "continues within the cross-domain bound, not bytewise",
                    rid,
                    written,
                    self.pipeline.domain,
                )
                self.metrics.domain_changes.inc()


def progress_key(group: str, request_id: str) -> str:
    """The key of a checkpoint on the compacted progress topic: the group, U+001F (the unit
    separator, in no sane group id) and the request id, so groups never compact away each
    other's checkpoints. (v1 checkpoints were keyed by the request id alone.)"""
    return f"{group}\x1f{request_id}"


def transactional_producer_config(
    client_config: dict[str, str], transactional_id: str, transaction_timeout_ms: int
) -> dict[str, Any]:
    """The service's transactional producer (bench/bench_transaction.py measures the same)."""
    config: dict[str, Any] = dict(client_config)
    config.update(
        {
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "linger.ms": 1,
            # A step's transaction begins right after the previous commit, while the
            # coordinator may still be writing its markers: it answers CONCURRENT_TRANSACTIONS
            # and librdkafka retries after retry.backoff.ms, doubling up to the max. Measured
            # on the local broker, back-to-back steps (bench_transaction.py): p50 ~110 ms with
            # the default 100, 14 ms with 10, 5 ms with 1. Other retries back off the same way.
            "retry.backoff.ms": 1,
            "retry.backoff.max.ms": 100,
            "transaction.timeout.ms": transaction_timeout_ms,
            "partitioner": "murmur2_random",
            "message.max.bytes": 4_000_000,
        }
    )
    return config


def install_stop_handlers(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set `stop`: the service finishes its step, commits and exits 0."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def read_partition(
    client_config: dict[str, str],
    topic: str,
    partition: int,
    start: int,
    end: int | None,
    timeout_s: float = 30.0,
) -> list[InputRecord]:
    """Every committed record of one partition from `start` up to `end` (exclusive), or up to
    the partition's end (the last stable offset: read_committed) when `end` is None.
    Uses assign(), no group commits."""
    config: dict[str, Any] = dict(client_config)
    config.setdefault("logger", KAFKA_LOG)
    config.update(
        {
            "group.id": "codeclog-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    if end is not None and end <= start:
        return []
    consumer = Consumer(config)
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        return _read_until(consumer, TopicPartition(topic, partition), end, timeout_s)
    finally:
        consumer.close()


def read_partitions(
    client_config: dict[str, str], topic: str, partitions: list[int], timeout_s: float = 10.0
) -> dict[int, list[InputRecord]]:
    """Every committed record of several partitions of `topic` up to their ends, with one
    reader (`read_partition` for each would pay a client start-up per partition). Gives up
    (ClusterUnavailableError) when nothing arrives for `timeout_s`, however long the read."""
    config: dict[str, Any] = dict(client_config)
    config.setdefault("logger", KAFKA_LOG)
    config.update(
        {
            "group.id": "codeclog-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    result: dict[int, list[InputRecord]] = {p: [] for p in partitions}
    if not partitions:
        return result
    waiting = set(partitions)
    consumer = Consumer(config)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout_s
        while waiting:
            if time.monotonic() > deadline:
                raise ClusterUnavailableError(
                    f"timed out reading {topic} partitions {sorted(waiting)} to their end"
                )
            messages = consumer.consume(500, 0.2)
            if messages:
                deadline = time.monotonic() + timeout_s
            for message in messages:
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    waiting.discard(message.partition() or 0)
                    continue
                record = VocoderService._record(message)
                if record is not None:
                    result[record.position.partition].append(record)
    finally:
        consumer.close()
    return result


def _read_until(
    consumer: Consumer, tp: TopicPartition, end: int | None, timeout_s: float
) -> list[InputRecord]:
    records: list[InputRecord] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for message in consumer.consume(500, 0.2):
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                if end is None:
                    return records
                continue
            record = VocoderService._record(message)
            if record is not None and (end is None or record.position.offset < end):
                records.append(record)
        if end is not None and consumer.position([tp])[0].offset >= end:
            return records
    raise ClusterUnavailableError(
        f"timed out reading {tp.topic}[{tp.partition}] up to offset {end}"
    )


def _one_line(exc: BaseException) -> str:
    """An exception as one line (librdkafka messages can span several); a KafkaError as its
    name and message, not its repr."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if isinstance(error, KafkaError):
        text = f"{error.name()}: {error.str()}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())
