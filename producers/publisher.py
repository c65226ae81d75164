"""The durable talker side: an idempotent Kafka publisher of codec chunks and control events.
Its guarantees: docs/talker.md, "Publishing"."""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from codeclog.errors import CodeclogError, ConfigError
from codeclog.kafka.access import (
    authorization_error,
    hidden_topic_hint,
    is_authorization_error,
    raise_if_topic_refused,
)
from codeclog.kafka.log import KAFKA_LOG, client_settings
from codeclog.producers.talker import Record
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk

DEFAULT_TOPIC = "codec.chunks"
LATENCY_SAMPLES_MAX = 100_000  # produce-to-ack samples kept (a ring: the newest win)
BACKPRESSURE_POLL_S = 0.05
PURGE_REPORT_TIMEOUT_S = 1.0  # time to serve the delivery reports of purged records at close

# Settings the publisher's guarantees depend on: a user properties file may not weaken them.
_REQUIRED = {
    "enable.idempotence": ("true",),
    "acks": ("all", "-1"),
    "partitioner": ("murmur2_random",),
    "compression.type": ("none",),
    "compression.codec": ("none",),
}


class PublishError(CodeclogError):
    """Base of the publisher errors."""


class PublisherConfigError(PublishError, ConfigError, ValueError):
    """The publisher configuration is invalid or contradicts its guarantees."""


class PublishBackpressureError(PublishError):
    """The local queue stayed full past the back-pressure deadline; the record was not queued."""

    def __init__(self, request_id: str, waited_s: float, queued: int) -> None:
        super().__init__(
            f"local Kafka queue full for {waited_s:.2f} s ({queued} records waiting) while "
            f"publishing request {request_id!r}: the broker is slower than the talker or "
            f"unreachable"
        )
        self.request_id = request_id
        self.waited_s = waited_s
        self.queued = queued


class PublisherClosedError(PublishError):
    """publish() after close()."""


class TopicNotReadyError(PublishError):
    """The cluster cannot be reached, or the topic to publish to does not exist."""


@dataclasses.dataclass(frozen=True, slots=True)
class PublisherConfig:
    """How the publisher talks to the cluster (validated on construction)."""

    topic: str = DEFAULT_TOPIC
    producer_id: str = ""  # stamped by Talker on records; also the librdkafka client.id
    linger_ms: float = 1.0  # batching delay; 0-1 for live audio, more only for bulk replay
    delivery_timeout_ms: int = 30_000  # retries end here; then the record is a reported failure
    queue_max_records: int = 100_000  # librdkafka queue.buffering.max.messages
    backpressure_timeout_s: float = 5.0  # how long publish() waits for room in a full queue

    def __post_init__(self) -> None:
        if not self.topic:
            raise PublisherConfigError("topic must not be empty")
        if not 0 <= self.linger_ms <= 900_000:
            raise PublisherConfigError(f"linger_ms must be in 0..900000, got {self.linger_ms}")
        if self.delivery_timeout_ms < 1:
            raise PublisherConfigError("delivery_timeout_ms must be >= 1")
        if self.queue_max_records < 1:
            raise PublisherConfigError("queue_max_records must be >= 1")
        if self.backpressure_timeout_s < 0:
            raise PublisherConfigError("backpressure_timeout_s must be >= 0")


def producer_settings(client_config: Mapping[str, str], config: PublisherConfig) -> dict[str, Any]:
    """librdkafka properties: the user's (bootstrap, security) plus the publisher's guarantees."""
    for key, allowed in _REQUIRED.items():
        value = client_config.get(key)
        if value is not None and str(value).lower() not in allowed:
            raise PublisherConfigError(
                f"kafka config sets {key}={value}, but the talker publisher requires "
                f"{key}={allowed[0]} (exactly-once per producer, partitions shared with Java)"
            )
    settings = client_settings(
        client_config,
        {
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            "compression.type": "none",
            "linger.ms": config.linger_ms,
            "message.timeout.ms": config.delivery_timeout_ms,
            "queue.buffering.max.messages": config.queue_max_records,
        },
    )
    if config.producer_id:
        settings.setdefault("client.id", config.producer_id)
    return settings


def topic_partition_count(
    client_config: Mapping[str, str],
    topic: str,
    timeout_s: float = 10.0,
    admin_factory: Callable[[dict[str, Any]], Any] = AdminClient,
) -> int:
    """Partitions of `topic`; TopicNotReadyError when the cluster or the topic is missing.

    Asks for the whole cluster's metadata: naming a missing topic in a metadata request can
    auto-create it with the broker's default partition count, which would break the layout.
    """
    admin = admin_factory(client_settings(client_config))
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        bootstrap = client_config.get("bootstrap.servers", "?")
        raise TopicNotReadyError(
            f"no answer from the Kafka cluster at {bootstrap} within {timeout_s:g} s "
            f"({_kafka_error(exc).str()})"
        ) from exc
    found = metadata.topics.get(topic)
    if found is None:
        raise_if_topic_refused(client_config, topic, timeout_s)
        raise TopicNotReadyError(
            f"topic {topic!r} does not exist{hidden_topic_hint(client_config)}; run "
            "`codeclog topics create` first"
        )
    return len(found.partitions)


@dataclasses.dataclass(frozen=True, slots=True)
class DeliveryFailure:
    """A record that did not reach the log, and why."""

    request_id: str
    kind: str  # "codec_chunk" or "control_event:<kind>"
    cache_epoch: int | None  # None for control events
    chunk_seq: int | None
    error_name: str  # librdkafka error name, e.g. MSG_SIZE_TOO_LARGE, _MSG_TIMED_OUT
    error: str  # human-readable message
    retriable: bool
    fatal: bool  # the producer instance is unusable and must be recreated


@dataclasses.dataclass(frozen=True, slots=True)
class PublisherStats:
    """A snapshot of the counters."""

    published: int  # records accepted into the local queue
    delivered: int  # acknowledged by the broker (acks=all)
    failed: int  # reported failures (refused by produce() or by a delivery report)
    in_flight: int  # queued, no report yet
    backpressure_waits: int  # publish() calls that found the queue full at least once
    client_errors: int  # librdkafka global errors (broker down, ...): informative, not loss
    latency_ms: tuple[float, ...]  # produce-to-ack samples, oldest first


@dataclasses.dataclass(frozen=True, slots=True)
class CloseReport:
    """What close() could and could not deliver."""

    delivered: int
    failed: int
    undelivered: int  # not acknowledged when the flush timeout ran out (also in failed)


FailureCallback = Callable[[DeliveryFailure], None]


class _Counters:
    """The publisher's mutable tallies, in one place (`PublisherStats` is their snapshot)."""

    def __init__(self) -> None:
        self.published = 0
        self.delivered = 0
        self.failed = 0
        self.in_flight = 0
        self.backpressure_waits = 0
        self.client_errors = 0
        self.latency_ms: deque[float] = deque(maxlen=LATENCY_SAMPLES_MAX)

    def snapshot(self) -> PublisherStats:
        values = {field.name: getattr(self, field.name) for field in _STATS_FIELDS}
        return PublisherStats(**values | {"latency_ms": tuple(self.latency_ms)})


_STATS_FIELDS = dataclasses.fields(PublisherStats)


class ChunkPublisher:
    """Publishes codec chunks and control events, keyed by request id. Not thread-safe."""

    def __init__(
        self,
        client_config: Mapping[str, str],
        config: PublisherConfig | None = None,
        *,
        on_failure: FailureCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
        producer_factory: Callable[[dict[str, Any]], Any] = Producer,
    ) -> None:
        self.config = config or PublisherConfig()
        settings = producer_settings(client_config, self.config)
        settings["error_cb"] = self._on_client_error
        self._producer = producer_factory(settings)
        self._client_config = dict(client_config)
        # The first delivery refused by the authorizer: publishing more cannot succeed.
        self.refused: KafkaError | None = None
        self._on_failure = on_failure
        self._clock = clock
        self._counts = _Counters()
        self.failures: list[DeliveryFailure] = []
        self.last_client_error: str = ""
        self._closed = False

    # publishing -------------------------------------------------------------------------------
    def publish(self, record: Record) -> None:
        """Queue one record; delivery is reported later (poll / flush / close)."""
        if self._closed:
            raise PublisherClosedError("the publisher is closed")
        self.raise_if_refused()
        value = wire.encode(record)
        key = record.request_id.encode("utf-8")
        self._produce(record, key, value)
        self._producer.poll(0)  # serve delivery reports as we go: no thread needed

    def publish_all(self, records: Iterable[Record]) -> None:
        for record in records:
            self.publish(record)

    def _produce(self, record: Record, key: bytes, value: bytes) -> None:
        deadline = self._clock() + self.config.backpressure_timeout_s
        waited = False
        while True:
            try:
                self._producer.produce(
                    self.config.topic, value, key, on_delivery=self._report(record, self._clock())
                )
            except BufferError:
                waited = self._wait_for_room(record, deadline, waited)
                continue
            except KafkaException as exc:
                self._fail(record, _kafka_error(exc))
                return
            self._counts.published += 1
            self._counts.in_flight += 1
            return

    def _wait_for_room(self, record: Record, deadline: float, waited: bool) -> bool:
        if not waited:
            self._counts.backpressure_waits += 1
        now = self._clock()
        if now >= deadline:
            queued = len(self._producer)
            waited_s = self.config.backpressure_timeout_s
            raise PublishBackpressureError(record.request_id, waited_s, queued)
        self._producer.poll(min(BACKPRESSURE_POLL_S, deadline - now))
        return True

    # delivery reports ---------------------------------------------------------------------------
    def _report(self, record: Record, produced_at: float) -> Callable[[Any, Any], None]:
        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            self._counts.in_flight -= 1
            if err is None:
                self._counts.delivered += 1
                self._counts.latency_ms.append((self._clock() - produced_at) * 1000.0)
            else:
                self._fail(record, err)

        return on_delivery

    def raise_if_refused(self) -> None:
        """KafkaAuthorizationError once a delivery was refused by the authorizer."""
        if self.refused is not None:
            raise authorization_error(
                self._client_config, "WRITE", f"topic {self.config.topic}", self.refused
            )

    def _fail(self, record: Record, err: KafkaError) -> None:
        if is_authorization_error(err) and self.refused is None:
            self.refused = err
        failure = _failure(record, err)
        self._counts.failed += 1
        self.failures.append(failure)
        if self._on_failure is not None:
            self._on_failure(failure)

    def _on_client_error(self, err: KafkaError) -> None:
        self._counts.client_errors += 1
        self.last_client_error = f"{err.name()}: {err.str()}"

    # lifecycle ----------------------------------------------------------------------------------
    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve delivery reports; returns how many were served."""
        return int(self._producer.poll(timeout_s))

    def flush(self, timeout_s: float) -> int:
        """Wait until everything queued is reported or the timeout; returns what is left."""
        return int(self._producer.flush(timeout_s))

    def close(self, timeout_s: float = 10.0) -> CloseReport:
        """Flush with a timeout; records still queued then are purged and reported as failed."""
        if self._closed:
            return CloseReport(self._counts.delivered, self._counts.failed, 0)
        self._closed = True
        undelivered = self.flush(timeout_s)
        if undelivered:
            # Purged records get a delivery report (_PURGE_QUEUE / _PURGE_INFLIGHT), so each one
            # lands in `failures` with its position. An in-flight one may still have been
            # written: "not confirmed" is the honest report.
            self._producer.purge(in_queue=True, in_flight=True, blocking=False)
            self._producer.flush(PURGE_REPORT_TIMEOUT_S)
            KAFKA_LOG.error("closed with %d undelivered records", undelivered)
        return CloseReport(self._counts.delivered, self._counts.failed, undelivered)

    @property
    def stats(self) -> PublisherStats:
        return self._counts.snapshot()

    def __enter__(self) -> ChunkPublisher:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _kafka_error(exc: KafkaException) -> KafkaError:
    first = exc.args[0] if exc.args else None
    if isinstance(first, KafkaError):
        return first
    return KafkaError(KafkaError._FAIL, str(exc))


def _failure(record: Record, err: KafkaError) -> DeliveryFailure:
    if isinstance(record, CodecChunk):
        kind, epoch, seq = "codec_chunk", record.cache_epoch, record.chunk_seq
    else:
        kind, epoch, seq = f"control_event:{record.kind.value}", None, None
    return DeliveryFailure(
        request_id=record.request_id,
        kind=kind,
        cache_epoch=epoch,
        chunk_seq=seq,
        error_name=err.name(),
        error=err.str(),
        retriable=err.retriable(),
        fatal=err.fatal(),
    )
