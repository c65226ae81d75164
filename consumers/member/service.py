"""The Code2Wav consumer service: a consumer-group member that polls, decodes and commits, and
raises what ends it. Reasons: docs/operating.md, "A step and its transaction"."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaException, TopicPartition

from codeclog.consumers.member.boundary import (
    TRANSACTION_ERRORS,
    TransactionBoundary,
    TransactionError,
)
from codeclog.consumers.member.config import VocodeConfig
from codeclog.consumers.member.intake import Intake
from codeclog.consumers.member.live import LiveWriter
from codeclog.consumers.member.metrics import VocoderMetrics
from codeclog.consumers.member.outage import OutageClock
from codeclog.consumers.member.progress import CheckpointBuilder
from codeclog.consumers.member.recovery import Recovery
from codeclog.consumers.member.refusals import Refusals
from codeclog.consumers.member.startup import cluster_facts
from codeclog.consumers.member.step_writes import (
    AudioRecord,
    StepWrites,
    audio_records,
    live_writes,
    step_writes,
)
from codeclog.consumers.member.tally import StepTally
from codeclog.consumers.member.transaction import CLOSE_ON_FAILURE_S, Transactions
from codeclog.consumers.stream.dead_letter import DEAD_LETTER_RAW_LIMIT
from codeclog.consumers.stream.engine import EngineMismatchError, VocoderEngine
from codeclog.consumers.stream.fold.report import strict_error_json
from codeclog.consumers.stream.limit import StreamLimit
from codeclog.consumers.stream.pipeline import AudioPipeline, StepOutput
from codeclog.errors import EXIT_STRICT_FATAL, CodeclogError
from codeclog.kafka.access import KafkaAccessError
from codeclog.kafka.calls import (
    ClusterUnavailableError,
    InfrastructureError,
    StuckCallError,
    bounded,
    one_line,
)
from codeclog.kafka.records import InputRecord
from codeclog.topics_config import TopicsConfig

log = logging.getLogger("codeclog.vocode")
RETRY_PAUSE_S = 1.0  # between two recovery attempts while the cluster does not answer
OPEN_TRANSACTION_MARGIN_S = 30.0  # past the cleanup check (10 s) and the read timeouts


class StrictFatalError(CodeclogError):
    """The strict policy met a rejection: the upstream stage would have died here."""

    EXIT_CODE = EXIT_STRICT_FATAL


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
        transactions: TransactionBoundary | None = None,
    ) -> None:
        self.client_config = client_config
        self.topics = topics
        self.config = config
        self.engine = engine
        self.metrics = metrics or VocoderMetrics.create(None)
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.refusals = Refusals(client_config, topics, config.group, config.transactional_id)
        self._dead_letter_limit = DEAD_LETTER_RAW_LIMIT
        self.limit = self._stream_limit(topics.partitions)
        self.pipeline = self._new_pipeline()
        self.transactions: TransactionBoundary = transactions or Transactions(
            client_config,
            config.transactional_id,
            config.transaction_timeout_ms,
            config.kafka_timeout_s,
            self.metrics,
            self.refusals.of,
            config.reinit_after_indefinite,
            config.max_queued_bytes,
        )
        self.live = LiveWriter(client_config, self.metrics)
        self.intake = Intake(
            client_config, config.intake(topics.chunks), self.metrics, self.refusals, self
        )
        self.checkpoints = CheckpointBuilder(topics.chunks, config.group, config.transactional_id)
        self.recovery = Recovery(config.recovery_source(client_config, topics), self.metrics)
        # a transaction left open is aborted by its coordinator within its timeout, found by
        # a check every 10 s (transaction.abort.timed.out.transaction.cleanup.interval.ms)
        self.outage = OutageClock(
            config.outage_timeout_s,
            self.bootstrap,
            open_transaction_s=config.transaction_timeout_ms / 1000 + OPEN_TRANSACTION_MARGIN_S,
        )
        self.finished = threading.Event()  # run() returned or raised
        self._stop = stop_event or threading.Event()
        self._assign_failed: BaseException | None = None  # recovery in a callback failed
        self.tally = StepTally(self.metrics, self._clock_ms)

    # -- lifecycle ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the current step, commit it, and leave (SIGTERM handler)."""
        self._stop.set()

    @property
    def stats(self) -> dict[str, int]:
        return {**self.tally.totals, "pauses": self.intake.pauses}

    @property
    def abandoned_clients(self) -> int:
        """Producers given up on (stuck or fatal). The CLI ends with os._exit when > 0:
        destroying a handle with a call still inside librdkafka can block."""
        return self.transactions.abandoned

    @property
    def bootstrap(self) -> str:
        return str(self.client_config.get("bootstrap.servers", "?"))

    def run(self) -> None:
        """Run until stopped (or idle, with exit_when_idle_s). Raises what ends the member:
        KafkaAccessError (a refusal: exit 2), InfrastructureError (exit 1),
        EngineMismatchError and ConfigError (exit 2), StrictFatalError (exit 3)."""
        closing_s = self.config.kafka_timeout_s
        try:
            if not self._stop.is_set():
                self._start()
                self._loop()
        except KafkaAccessError:  # refused credentials or ACL: a configuration error
            closing_s = CLOSE_ON_FAILURE_S
            self.transactions.end_refused()
            raise
        except StrictFatalError:
            raise
        except BaseException:
            closing_s = CLOSE_ON_FAILURE_S
            log.debug("the member ends", exc_info=True)
            self.transactions.end_on_failure()
            raise
        finally:
            self.transactions.join()
            self._close(closing_s)
            self.finished.set()

    def _start(self) -> None:
        facts = cluster_facts(self.client_config, self.topics, self.config.kafka_timeout_s)
        if facts.chunk_partitions not in (None, self.limit.partitions):
            self.limit = self._stream_limit(facts.chunk_partitions)
        self._dead_letter_limit = facts.dead_letter_raw_limit
        self.pipeline = self._new_pipeline()
        if self.config.live_audio:
            self.live.start(self.topics.live, facts.live_exists)
        log.info("open streams: %s", self.limit.describe())
        try:
            self.transactions.start(self.config.outage_timeout_s, self._stop)
        except TRANSACTION_ERRORS as exc:
            if (refused := self.refusals.of(exc)) is not None:
                raise refused from exc
            raise InfrastructureError(
                f"cannot initialise transactions on the cluster at {self.bootstrap}: "
                f"{one_line(exc)}"
            ) from exc
        self.intake.start()

    def _close(self, bound_s: float) -> None:
        def close(call: Callable[[], None]) -> None:
            try:
                bounded("consumer close", call, bound_s)
            except (KafkaException, RuntimeError, StuckCallError) as exc:
                log.warning("consumer close failed: %s", exc)

        self.intake.close(close)
        self.transactions.close()
        self.live.close(bound_s)

    def _stream_limit(self, partitions: int) -> StreamLimit:
        return self.config.limits.resolve(partitions, self.engine)

    def _new_pipeline(self) -> AudioPipeline:
        pipeline_config = self.config.pipeline(self.limit, self._dead_letter_limit)
        return AudioPipeline(pipeline_config, self.engine, self._clock_ms)

    # -- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        idle_since = time.monotonic()
        while not self._stop.is_set():
            records = self._poll()
            if not records:
                if not self.transactions.committing:  # a failure never waits for a next step
                    self._settle()
                if not self.intake.assignment():
                    idle_since = time.monotonic()  # idle means "assigned and nothing to do"
                    continue
                limit = self.config.exit_when_idle_s
                if limit is not None and time.monotonic() - idle_since > limit:
                    self._settle()
                    if self.intake.drained():
                        log.info("idle for %.1f s with nothing left to read: stopping", limit)
                        break
                    idle_since = time.monotonic()
                continue
            idle_since = time.monotonic()
            out = self._step(records)
            if out.fatal is not None:
                self._settle()
                raise _strict_fatal(out)
        self._settle()

    def _poll(self) -> list[InputRecord]:
        records = self.intake.poll()
        if self._assign_failed is not None:  # partitions came without their state: rebuild
            failure, self._assign_failed = self._assign_failed, None
            self._settle()
            self._rebuild_after(failure)
            return []
        return records

    def _step(self, records: Sequence[InputRecord]) -> StepOutput:
        try:
            return self._transaction(records)
        except TRANSACTION_ERRORS as exc:
            self._recover_from(exc)
            return StepOutput()

    def _transaction(self, records: Sequence[InputRecord]) -> StepOutput:
        """Decode the step (while earlier transactions are written) and write its windows live
        at once, then queue all it made for a transaction written in the background."""
        started = time.perf_counter()
        positions = self.intake.positions()  # what this step consumed; before the next poll
        decoded = self.intake.decode(lambda: self._decode_live(records))
        if decoded is None:  # a rebalance happened meanwhile: the step is void, start over
            self.tally.void_step()
            try:
                self.transactions.await_commit()
            except TRANSACTION_ERRORS as exc:  # the one rebuild below
                self._recover_from(exc)
                return StepOutput()
            try:
                self._rewind()
            except (*TRANSACTION_ERRORS, ClusterUnavailableError) as exc:
                self._rebuild_after(exc)  # retried until the outage limit, as any rebuild
            return StepOutput()
        out, audio = decoded
        self.checkpoints.note_epoch_starts(out)
        checkpoints = self.checkpoints.checkpoints(self.pipeline, out, self._clock_ms())
        rows, progress = step_writes(out, audio, checkpoints, self.topics, self.config.group)
        step = StepWrites(rows, progress, positions, self.intake.group_metadata())
        # raises if an earlier transaction failed: this step is then discarded
        self.transactions.write_step(step, lambda: self._committed_step(out, started))
        self.tally.queued(out, self.pipeline)
        return out

    def _decode_live(self, records: Sequence[InputRecord]) -> tuple[StepOutput, list[AudioRecord]]:
        """On the decode thread: the step, and its windows written live as soon as it returns,
        not once the polling thread has seen it end (on a busy machine that thread may first
        wait for a core). A step voided meanwhile by a rebalance has then gone out live too:
        the same bytes as its re-decode, as a step whose transaction aborts
        (docs/listening.md, "Two copies of every window")."""
        out = self.pipeline.step(records)
        audio = audio_records(out)
        self.live.write(live_writes(audio, self.topics))  # before any wait for a transaction
        return out, audio

    def _committed_step(self, out: StepOutput, started: float) -> None:
        """On the commit thread, after the step's transaction committed."""
        self.outage.committed()
        self.tally.committed(out, time.perf_counter() - started)

    def _settle(self) -> None:
        """Wait for the queued steps' transactions and handle a failure (before idle checks,
        rewinds and shutdown, which all read or hand over committed state)."""
        try:
            self.transactions.await_commit()
        except TRANSACTION_ERRORS as exc:
            self._recover_from(exc)

    # -- failures -------------------------------------------------------------------------------

    def _recover_from(self, exc: TransactionError) -> None:
        """A transaction failed (this step's or the previous): abort, rebuild from the log."""
        self.transactions.handle_error(exc)
        self._rebuild_after(exc)

    def _rebuild_after(self, exc: BaseException) -> None:
        """Rewind to the committed offsets, retrying while the cluster does not answer, until
        outage_timeout_s after the first failure (then InfrastructureError: exit 1); an
        authorization or authentication failure ends the member at once (exit 2)."""
        self.refusals.raise_if_refused(exc)
        self.outage.failed(exc)
        while True:
            try:
                self.transactions.ensure_producer(self.outage.last_error)
                self._rewind()
                return
            except (*TRANSACTION_ERRORS, ClusterUnavailableError) as again:
                if isinstance(again, StuckCallError):
                    self.transactions.mark_wedged()
                self.refusals.raise_if_refused(again)
                log.warning("recovery failed (%s): retrying", one_line(again))
                self.outage.failed(again)
                if self._stop.wait(RETRY_PAUSE_S):
                    raise InfrastructureError(
                        f"stopped while the cluster at {self.bootstrap} did not answer "
                        f"({self.outage.last_error}); the uncommitted step is redone by the "
                        "next member"
                    ) from again

    def _rewind(self) -> None:
        """After an aborted step: rebuild all state from the log as after a fresh assignment."""
        assignment = self.intake.assignment()
        self.pipeline = self._new_pipeline()
        self.checkpoints.reset()
        committed = self.intake.committed(assignment)
        self._restore(committed)
        self.intake.seek_to(committed)
        self._assign_failed = None  # every assigned partition is rebuilt now

    # -- rebalance (intake.Hooks) ---------------------------------------------------------------

    def assigned(self, partitions: list[TopicPartition]) -> None:
        self.transactions.join()
        try:
            self._restore(self.intake.committed(partitions))
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

    def revoked(self, partitions: list[TopicPartition]) -> None:
        self.transactions.join()  # hand over committed work only
        for tp in partitions:
            self.pipeline.drop_partition(tp.partition)

    def _restore(self, committed: list[TopicPartition]) -> None:
        """Recovery of assigned partitions (consumers/member/recovery.py) into this pipeline."""
        self.checkpoints.epoch_start.update(self.recovery.restore(self.pipeline, committed))


def _strict_fatal(out: StepOutput) -> StrictFatalError:
    assert out.fatal is not None
    return StrictFatalError(
        "strict policy: the upstream stage would have died here: "
        f"MiniCPMO45Code2WavBatchError {strict_error_json(out.fatal)} "
        f"(request {out.fatal.request_id!r}, epoch {out.fatal.cache_epoch}, "
        f"seq {out.fatal.chunk_seq}); later records stay unprocessed"
    )
