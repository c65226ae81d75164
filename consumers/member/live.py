"""The live copy: every decoded window written at once to the live topic, outside any transaction,
best effort. Reasons: docs/listening.md, "Two copies of every window"."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from codeclog.consumers.member.metrics import VocoderMetrics
from codeclog.consumers.member.step_writes import OutputRecord
from codeclog.kafka.calls import StuckCallError, bounded, one_line
from codeclog.kafka.log import client_settings

log = logging.getLogger("codeclog.vocode")

# A live copy later than this is worth little to a listener (the committed copy follows within
# a transaction); a short timeout also keeps a zombie's late copies from trailing for minutes.
LIVE_TIMEOUT_MS = 5_000


def live_producer_config(client_config: dict[str, str]) -> dict[str, Any]:
    """The live copy's producer: idempotent (no duplicates from its own retries, order kept per
    partition; one producer id per member incarnation), no transaction, the same partitioner
    and linger as the transactional one."""
    config = client_settings(client_config)
    config.update(
        {
            "enable.idempotence": True,
            "linger.ms": 1,
            "retry.backoff.ms": 1,
            "retry.backoff.max.ms": 100,
            "partitioner": "murmur2_random",
            "message.max.bytes": 4_000_000,
            "message.timeout.ms": LIVE_TIMEOUT_MS,
            # a missing live topic must not be created with the broker's defaults (no
            # retention); the member checks it exists at start
            "allow.auto.create.topics": False,
        }
    )
    return config


class LiveWriter:
    """The member's live producer; every call returns at once."""

    def __init__(self, client_config: dict[str, str], metrics: VocoderMetrics) -> None:
        self.config = live_producer_config(client_config)
        self.metrics = metrics
        self.producer: Producer | None = None
        self.topic = ""
        self.failing = False  # the last delivery failed: the next success is logged
        self.counts = {"written": 0, "failed": 0, "dropped": 0}
        self._fatal = False

    def start(self, topic: str, exists: bool = True) -> None:
        """The producer, unless the live topic does not exist (then no live copies)."""
        if not exists:
            log.warning(
                "topic %s does not exist: no live copies, speculative listeners hear the "
                "committed audio only (codeclog topics create makes it)",
                topic,
            )
            return
        self.topic = topic
        self.producer = Producer({**self.config, "error_cb": self._error})

    def write(self, records: Sequence[OutputRecord]) -> None:
        """Queue the records (never waits); serve delivery reports of earlier ones."""
        if self._fatal:
            self._replace()
        producer = self.producer
        if producer is None:
            return
        for record in records:
            try:
                producer.produce(
                    record.topic, value=record.value, key=record.key, on_delivery=self._delivered
                )
            except BufferError:
                self._count("dropped")
            except KafkaException as exc:  # e.g. a fatal error raised at produce()
                self._count("dropped")
                log.debug("live copy not queued: %s", one_line(exc))
        producer.poll(0)

    def close(self, bound_s: float) -> None:
        """Deliver what is queued, for at most `bound_s`."""
        producer, self.producer = self.producer, None
        if producer is None:
            return
        try:
            bounded("live flush", lambda: producer.flush(bound_s), bound_s)
        except (KafkaException, StuckCallError) as exc:
            log.warning("live producer flush failed: %s", one_line(exc))

    def _delivered(self, error: KafkaError | None, message: Any) -> None:
        if error is None:
            self._count("written")
            if self.failing:
                self.failing = False
                log.info("live copies are delivered again")
            return
        self._count("failed")
        if not self.failing:  # one line per run of failures
            self.failing = True
            log.warning(
                "a live copy was not delivered (%s): speculative listeners get the committed "
                "copy of such windows",
                error,
            )

    def _error(self, error: KafkaError) -> None:
        if error.fatal():
            log.warning("live producer: fatal error (%s): it will be replaced", error)
            self._fatal = True

    def _replace(self) -> None:
        """After a fatal error: a new producer (what the old one held is given up)."""
        self._fatal = False
        old, self.producer = self.producer, None
        if old is not None:
            old.purge()
        self.start(self.topic)

    def _count(self, result: str) -> None:
        self.counts[result] += 1
        self.metrics.live_windows.labels(result=result).inc()
