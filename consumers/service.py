"""The Code2Wav consumer service: a consumer-group member that polls, decodes and commits.

One step = one `consume()` of up to `max_records` records, the shared AudioPipeline (fold +
batched vocoder decode), then ONE Kafka transaction (consumers/transaction.py) that carries the
audio chunks, the dead letters, a checkpoint per touched request (consumers/progress.py) and the
consumed offsets. While a step decodes on a worker thread, this thread keeps polling: records
become the next batch, rebalance callbacks run, and a saturated decoder pauses the assignment.
Partitions that arrive are restored by consumers/recovery.py; a failed transaction rewinds to
the committed offsets and restores every assigned partition the same way.

Modules: this loop; `transaction` (the transaction boundary and the commit thread); `progress`
(checkpoints written and read); `recovery` (state rebuilt on assignment); `log_reader` (reading
committed records without a group); `kafka_calls` (bounded librdkafka calls, error kinds).
"""

from __future__ import annotations

import dataclasses
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
    KafkaException,
    Message,
    TopicPartition,
)

from codeclog.consumers.fold.machine import FoldConfig, Policy
from codeclog.consumers.kafka_calls import (
    KAFKA_LOG,
    ClusterUnavailableError,
    InfrastructureError,
    StuckCallError,
    bounded,
    one_line,
    raise_if_denied,
)
from codeclog.consumers.log_reader import input_record
from codeclog.consumers.metrics import VocoderMetrics
from codeclog.consumers.pipeline import (
    DEAD_LETTER_HEADROOM_BYTES,
    DEAD_LETTER_RAW_LIMIT,
    AudioPipeline,
    EngineMismatchError,
    InputRecord,
    PipelineConfig,
    StepOutput,
    VocoderEngine,
)
from codeclog.consumers.progress import CheckpointWriter, progress_key
from codeclog.consumers.recovery import Recovery, RecoverySource
from codeclog.consumers.stream_limit import LimitOptions, StreamLimit
from codeclog.consumers.transaction import TransactionError, Transactions
from codeclog.errors import CodeclogError, UsageError
from codeclog.kafka_access import KafkaAccessError, refusal
from codeclog.schemas import wire
from codeclog.schemas.records import SAMPLE_RATE_HZ
from codeclog.topics_config import TopicsConfig

log = logging.getLogger("codeclog.vocode")
T = TypeVar("T")
DEFAULT_GROUP = "codeclog-vocoder"
EXIT_OK = 0
EXIT_INFRASTRUCTURE = 1
EXIT_USAGE = 2  # a refused login or ACL (codeclog.kafka_access): fixed in the config
EXIT_STRICT_FATAL = 3
RETRY_PAUSE_S = 1.0  # between two recovery attempts while the cluster does not answer
CLOSE_ON_FAILURE_S = 2.0  # abort, close and flush bounds once the member is exiting 1


@dataclasses.dataclass(frozen=True)
class VocodeConfig:
    """Knobs of the consumer service. Every bound is here."""

    group: str = DEFAULT_GROUP
    instance_id: str = "0"  # stable per member: a restart fences its own zombie transaction
    policy: Policy = Policy.TOLERANT
    max_records: int = 64  # records per step (and so windows per decode step)
    max_batch: int = 64  # windows per decode_batch call
    poll_timeout_s: float = 0.05
    # Open streams: at most limits.max_open_streams over the group, and a member's vocoder
    # states within its state budget, both as a count per input partition
    # (consumers.stream_limit); beyond it the least recently active stream is evicted.
    limits: LimitOptions = dataclasses.field(default_factory=LimitOptions)
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
        self.limit = self._stream_limit(topics.partitions)
        self.pipeline = self._new_pipeline()
        self.transactions = Transactions(
            client_config,
            config.transactional_id,
            config.transaction_timeout_ms,
            config.kafka_timeout_s,
            self.metrics,
        )
        self.transactions.refusal = self._refusal
        self.checkpoints = CheckpointWriter(topics.chunks, config.group, config.transactional_id)
        self.recovery = Recovery(
            RecoverySource(
                client_config,
                topics.chunks,
                topics.progress,
                config.group,
                config.kafka_timeout_s,
                config.rebuild_batch,
            ),
            self.metrics,
        )
        self._stop = stop_event or threading.Event()
        self._consumer: Consumer | None = None
        self._failing_since: float | None = None  # first failure since the last commit
        self._last_failure_at: float | None = None
        self._last_error = ""
        self._assign_failed: BaseException | None = None  # recovery in a callback failed
        self._finished = threading.Event()
        self._decoding: threading.Thread | None = None  # this step's decode, while it runs
        self._void_step = False  # the assignment changed during this step's decode
        self._pending: list[InputRecord] = []  # polled while a step decoded: the next batch
        self._paused: set[tuple[str, int]] = set()  # paused by a decode, not resumed yet
        self.stats: dict[str, int] = dict.fromkeys(
            ("records", "windows", "dead_letters", "duplicates", "steps", "pauses", "void_steps"),
            0,
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
        return self.transactions.abandoned

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
        except KafkaAccessError as exc:  # refused credentials or ACL: a configuration error
            print(f"codeclog vocode: {one_line(exc)}", file=sys.stderr)
            self.transactions.closing_timeout_s = CLOSE_ON_FAILURE_S
            self.transactions.wedged = True  # nothing to abort that the refusal would not refuse
            self.transactions.join()
            return EXIT_USAGE
        except (InfrastructureError, StuckCallError, KafkaException) as exc:
            print(f"codeclog vocode: {one_line(exc)}", file=sys.stderr)
            self._end_on_failure()
            return EXIT_INFRASTRUCTURE
        except (EngineMismatchError, UsageError) as exc:  # the wrong HiFT variant, a budget
            # too small for the topic's partitions: configuration
            print(f"codeclog vocode: {one_line(exc)}", file=sys.stderr)
            self._end_on_failure()
            return EXIT_USAGE
        except Exception as exc:  # a bug: still one line (the traceback is logged with -v)
            log.debug("unexpected error", exc_info=True)
            print(
                f"codeclog vocode: unexpected {type(exc).__name__}: {one_line(exc)}",
                file=sys.stderr,
            )
            self._end_on_failure()
            return EXIT_INFRASTRUCTURE
        finally:
            self.transactions.join()
            self._close()
            self._finished.set()

    def _end_on_failure(self) -> None:
        """The cluster is failing: short bounds from here on (an open transaction is aborted
        by the next member's init_transactions, or by its timeout)."""
        self.transactions.closing_timeout_s = CLOSE_ON_FAILURE_S
        self.transactions.join()
        self.transactions.abort_quietly()

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
        try:
            self.transactions.start(self.config.outage_timeout_s, self._stop)
        except (KafkaException, StuckCallError) as exc:
            if (refused := self._refusal(exc)) is not None:
                raise refused from exc
            raise InfrastructureError(
                f"cannot initialise transactions on the cluster at {self.bootstrap}: "
                f"{one_line(exc)}"
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
                f"({one_line(exc)})"
            ) from exc
        chunks = metadata.topics.get(self.topics.chunks)
        if chunks is None:
            log.warning("topic %s does not exist (yet) at %s", self.topics.chunks, self.bootstrap)
        elif chunks.partitions and len(chunks.partitions) != self.limit.partitions:
            self.limit = self._stream_limit(len(chunks.partitions))
            self.pipeline = self._new_pipeline()
        log.info("open streams: %s", self.limit.describe())
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

    def _close(self) -> None:
        bound = self.transactions.closing_timeout_s or self.config.kafka_timeout_s
        if self._consumer is not None:
            consumer = self._consumer
            try:
                self._bounded("consumer close", consumer.close, bound)
            except (KafkaException, RuntimeError, StuckCallError) as exc:
                log.warning("consumer close failed: %s", exc)
            self._consumer = None
        self.transactions.close()

    def _bounded(self, what: str, call: Callable[[], T], timeout_s: float | None = None) -> T:
        return bounded(what, call, self.config.kafka_timeout_s if timeout_s is None else timeout_s)

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

    def _stream_limit(self, partitions: int) -> StreamLimit:
        return self.config.limits.resolve(partitions, self.engine)

    def _new_pipeline(self) -> AudioPipeline:
        fold = FoldConfig(policy=self.config.policy, max_open_streams=self.limit.per_partition)
        pipeline_config = PipelineConfig(
            fold=fold,
            per_partition=True,
            max_batch=self.config.max_batch,
            producer_id=self.config.transactional_id,
            dead_letter_raw_limit=self._dead_letter_limit,
            eviction_cause=self.limit.cause,
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
        self._resume_paused()
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
        doing = self._doing()
        return [
            record
            for m in messages
            if (record := input_record(m, self.client_config, doing)) is not None
        ]

    def _doing(self) -> dict[str, str]:
        """What each kind of authorisation refusal means for this member (kafka_access)."""
        t = self.topics
        return {
            "topic": f"READ topic {t.chunks} or WRITE topics {t.audio}, {t.dlq}, {t.progress}",
            "group": f"READ group {self.config.group}",
            "transactional id": f"WRITE transactional id {self.config.transactional_id}",
        }

    def _refusal(self, exc: BaseException) -> CodeclogError | None:
        return refusal(exc, self.client_config, self._doing())

    def _raise_if_refused(self, exc: BaseException) -> None:
        """A refused login or ACL ends the member: one line naming the principal, the
        operation and the resource, exit 2 (README, "Security"); no retry helps."""
        if (refused := self._refusal(exc)) is not None:
            raise refused from exc
        raise_if_denied(exc)  # e.g. an authentication failure: no ACL resource to name

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

    def _step(self, records: Sequence[InputRecord]) -> StepOutput:
        try:
            return self._transaction(records)
        except (KafkaException, StuckCallError) as exc:
            self._recover_from(exc)
            return StepOutput()

    def _transaction(self, records: Sequence[InputRecord]) -> StepOutput:
        """Decode the step (while the previous commit is in flight), then write all it made in
        one transaction whose commit runs in the background (consumers/transaction.py)."""
        assert self._consumer is not None
        started = time.perf_counter()
        positions = self._positions()  # what this step consumed; taken before the next poll
        out = self._decode(records)
        if out is None:  # a rebalance happened meanwhile: the step is void, start over
            self.stats["void_steps"] += 1
            try:
                self.transactions.await_commit()
            except (KafkaException, StuckCallError) as exc:  # the one rebuild below
                self._recover_from(exc)
                return StepOutput()
            self._rewind()
            return StepOutput()
        tx = self.transactions
        tx.await_turn()  # raises if it failed: this step's results are then discarded
        self.checkpoints.note_epoch_starts(out)
        tx.begin()
        for chunk in out.audio:
            tx.produce(self.topics.audio, chunk.request_id, wire.encode(chunk))
        for letter in out.dead_letters:
            tx.produce(self.topics.dlq, letter.request_id or "", wire.encode(letter))
        now_ms = self._clock_ms()
        for checkpoint, partition in self.checkpoints.checkpoints(self.pipeline, out, now_ms):
            key = progress_key(self.config.group, checkpoint.request_id)
            tx.produce(self.topics.progress, key, wire.encode(checkpoint), partition)
        tx.send_offsets(positions, self._consumer.consumer_group_metadata())
        self.metrics.open_streams.set(self.pipeline.open_streams())
        for cause, count in out.evictions.items():
            self.metrics.evictions.labels(cause=cause).inc(count)
        tx.commit_in_background(lambda: self._committed_step(out, started))
        return out

    def _committed_step(self, out: StepOutput, started: float) -> None:
        """On the commit thread, after the step's transaction committed."""
        self._failing_since = None
        self._observe(out, time.perf_counter() - started)

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
                    self._paused.update((tp.topic, tp.partition) for tp in paused)
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
                self._resume_paused()
                self.metrics.paused_partitions.set(0)

    def _resume_paused(self) -> None:
        """Resume every partition a decode paused that is ours now. librdkafka keeps a
        partition's pause across its revocation and re-assignment, so one revoked or lost while
        paused and given back later stayed paused for good: no records, no error (the stall
        after a leader's SIGKILL, when the member's session expired during a decode). Those
        stay here until they are ours again (`_poll` resumes them)."""
        if not self._paused:
            return
        assert self._consumer is not None
        ours = [
            tp for tp in self._consumer.assignment() if (tp.topic, tp.partition) in self._paused
        ]
        if ours:
            self._consumer.resume(ours)
            self._paused.difference_update((tp.topic, tp.partition) for tp in ours)

    def _settle(self) -> None:
        """Wait for the commit in flight and handle its failure (before rebalances, idle checks
        and shutdown, which all read or hand over committed state)."""
        try:
            self.transactions.await_commit()
        except (KafkaException, StuckCallError) as exc:
            self._recover_from(exc)

    def _positions(self) -> list[TopicPartition]:
        assert self._consumer is not None
        positions = self._consumer.position(self._consumer.assignment())
        return [tp for tp in positions if tp.offset >= 0 and tp.offset != OFFSET_INVALID]

    def _observe(self, out: StepOutput, step_s: float) -> None:
        now_ms = self._clock_ms()
        m = self.metrics
        m.records.inc(out.records)
        m.windows.inc(len(out.audio))
        m.duplicates.inc(out.duplicates)
        m.transactions.labels(result="committed").inc()
        for size in out.batch_sizes:
            m.batch_size.observe(size)
        m.decode_seconds.observe(out.decode_s)
        if out.decode_calls:
            m.flow_calls.observe(out.flow_calls)
            m.hift_calls.observe(out.hift_calls)
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
        self.stats["duplicates"] += out.duplicates
        self.stats["steps"] += 1
        log.debug("step: %d records, %d windows in %.3f s", out.records, len(out.audio), step_s)

    # -- failures -------------------------------------------------------------------------------

    def _recover_from(self, exc: TransactionError) -> None:
        """A transaction failed (this step's or the previous): abort, rebuild from the log."""
        self.transactions.handle_error(exc)
        self._rebuild_after(exc)

    def _rebuild_after(self, exc: BaseException) -> None:
        """Rewind to the committed offsets, retrying while the cluster does not answer, until
        outage_timeout_s after the first failure (then InfrastructureError: exit 1); an
        authorization or authentication failure ends the member at once (exit 2)."""
        self._raise_if_refused(exc)
        self._note_failure(exc)
        while True:
            try:
                self.transactions.ensure_producer(self._last_error)
                self._rewind()
                return
            except (KafkaException, StuckCallError, ClusterUnavailableError) as again:
                if isinstance(again, StuckCallError):
                    self.transactions.wedged = True
                self._raise_if_refused(again)
                log.warning("recovery failed (%s): retrying", one_line(again))
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
        self._last_error = one_line(exc)
        failing_s = now - self._failing_since
        if failing_s > self.config.outage_timeout_s:
            raise InfrastructureError(
                f"no transaction committed for {failing_s:.0f} s: the cluster at "
                f"{self.bootstrap} keeps failing ({self._last_error}); giving up (the next "
                "member resumes from the committed offsets)"
            )

    def _rewind(self) -> None:
        """After an aborted step: rebuild all state from the log as after a fresh assignment."""
        assert self._consumer is not None
        assignment = self._consumer.assignment()
        self.pipeline = self._new_pipeline()
        self.checkpoints.reset()
        self._pending.clear()  # read again from the committed offsets
        committed = self._committed(assignment)
        self._restore(committed)
        for tp in committed:
            # nothing committed yet: from the start, as auto.offset.reset says
            start = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self._consumer.seek(TopicPartition(tp.topic, tp.partition, start))
        self._assign_failed = None  # every assigned partition is rebuilt now

    def _strict_fatal(self, out: StepOutput) -> int:
        assert out.fatal is not None
        from codeclog.consumers.fold.report import strict_error_json

        print(
            "codeclog vocode: strict policy: the upstream stage would have died here: "
            f"MiniCPMO45Code2WavBatchError {strict_error_json(out.fatal)} "
            f"(request {out.fatal.request_id!r}, epoch {out.fatal.cache_epoch}, "
            f"seq {out.fatal.chunk_seq}); later records stay unprocessed",
            file=sys.stderr,
        )
        return EXIT_STRICT_FATAL

    # -- rebalance ------------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._join_decode()
        self.transactions.join()
        try:
            self._restore(self._committed(partitions))
        except (
            ClusterUnavailableError,
            KafkaException,
            StuckCallError,
            EngineMismatchError,
        ) as exc:
            # Never raise out of a librdkafka callback: the loop rebuilds every partition
            # before it processes a record (`_poll`).
            log.warning("partition recovery failed (%s): rebuilding", one_line(exc))
            self._assign_failed = exc

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._join_decode()
        self.transactions.join()  # hand over committed work only
        for tp in partitions:
            self.pipeline.drop_partition(tp.partition)

    def _join_decode(self) -> None:
        """Inside a rebalance callback while a step decodes (`_poll_while_decoding`): let the
        decode finish before the pipeline changes, and void the step (the loop then rewinds)."""
        if self._decoding is not None:
            self._decoding.join()
            self._void_step = True

    def _committed(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        if not partitions:
            return []
        assert self._consumer is not None
        try:
            return list(self._consumer.committed(partitions, timeout=self.config.kafka_timeout_s))
        except KafkaException as exc:
            if (refused := self._refusal(exc)) is not None:
                raise refused from exc
            raise ClusterUnavailableError(
                f"cannot read committed offsets: {one_line(exc)}"
            ) from exc

    def _restore(self, committed: list[TopicPartition]) -> None:
        """Recovery of assigned partitions (consumers/recovery.py) into this pipeline."""
        self.checkpoints.epoch_start.update(self.recovery.restore(self.pipeline, committed))


def install_stop_handlers(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set `stop`: the service finishes its step, commits and exits 0."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
