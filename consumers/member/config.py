"""The member's knobs: every bound of the consumer service is here."""

from __future__ import annotations

import dataclasses

from codeclog.consumers.member.intake import IntakeConfig
from codeclog.consumers.member.recovery import RecoverySource
from codeclog.consumers.stream.fold.state import FoldConfig, Policy
from codeclog.consumers.stream.limit import LimitOptions, StreamLimit
from codeclog.consumers.stream.pipeline import PipelineConfig
from codeclog.topics_config import TopicsConfig

DEFAULT_GROUP = "codeclog-vocoder"


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
    # (consumers.stream.limit); beyond it the least recently active stream is evicted.
    limits: LimitOptions = dataclasses.field(default_factory=LimitOptions)
    transaction_timeout_ms: int = 60_000
    # Steps decoded and waiting for their transaction (consumers/member/transaction_queue.py):
    # beyond this many bytes of their records the member waits for the writer (back-pressure)
    max_queued_bytes: int = 32 * 2**20
    # Write each window to the live topic as soon as it is decoded (docs/listening.md); off, a
    # speculative listener hears the committed copy only
    live_audio: bool = True
    max_poll_interval_ms: int = 300_000
    exit_when_idle_s: float | None = None  # tests and the demo: stop after this long idle
    rebuild_batch: int = 256
    # Liveness bounds (docs/operating.md, "Liveness bounds"). Every librdkafka call that can
    # wait gets kafka_timeout_s; one that has not returned CALL_GRACE_S later is abandoned as
    # stuck.
    kafka_timeout_s: float = 10.0
    # After a failed transaction or call, the member aborts, rebuilds and retries; if no
    # transaction commits within outage_timeout_s of the first failure, it gives up (exit 1).
    outage_timeout_s: float = 60.0
    # After a call whose outcome is unknown (a timeout), replace the producer before the next
    # transaction: its epoch bump fences a late request. Off only in the test that shows it is
    # what keeps the history clean (CODECLOG_TEST_KEEP_PRODUCER_AFTER_TIMEOUT=1 for vocode).
    reinit_after_indefinite: bool = True

    @property
    def transactional_id(self) -> str:
        return f"{self.group}-{self.instance_id}"

    def pipeline(self, limit: StreamLimit, dead_letter_raw_limit: int) -> PipelineConfig:
        """The member's pipeline: one fold per input partition, capped at `limit`."""
        return PipelineConfig(
            fold=FoldConfig(policy=self.policy, max_open_streams=limit.per_partition),
            per_partition=True,
            max_batch=self.max_batch,
            producer_id=self.transactional_id,
            dead_letter_raw_limit=dead_letter_raw_limit,
            eviction_cause=limit.cause,
            report=False,
        )

    def intake(self, topic: str) -> IntakeConfig:
        return IntakeConfig(
            self.group,
            topic,
            self.max_records,
            self.poll_timeout_s,
            self.max_poll_interval_ms,
            self.kafka_timeout_s,
        )

    def recovery_source(
        self, client_config: dict[str, str], topics: TopicsConfig
    ) -> RecoverySource:
        """Where the member's recovery reads: its group's checkpoints, its input."""
        return RecoverySource(
            client_config,
            topics.chunks,
            topics.progress,
            self.group,
            self.kafka_timeout_s,
            self.rebuild_batch,
        )
