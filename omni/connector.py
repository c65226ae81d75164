"""`CodeclogKafkaConnector`: a vllm-omni OmniConnector on a durable Kafka topic.

It has the interface of vllm-omni's connector base (put, get, get_with_deadline, cleanup, health,
close, `supports_raw_data`; see README "Use from vllm-omni") without importing vllm-omni; the
plugin (`codeclog.omni.plugin`) registers it with vllm-omni's connector factory.

- put: one record keyed by the external request id of the put key, on an idempotent producer with
  acks=all (`producers.publisher.producer_settings`); returns (True, size, metadata) only after the
  broker acknowledged it, else (False, 0, None) with the reason logged and counted. It never
  raises. MiniCPM-o talker -> Code2Wav payloads travel as CodecChunk records, anything else as a
  PayloadEnvelope (omni.payload).
- get / get_with_deadline: served from an in-memory index that a background consumer fills
  (read_committed, its own group, started by the first get). get never blocks; get_with_deadline
  waits until the monotonic deadline at most. A get hands out an entry once (as vllm-omni's
  shared-memory connector does); a redelivered copy of a record already handed out is dropped.
- cleanup(request_id): forgets that request's entries; health(): counters, lag, last error;
  close(): flushes the producer and stops the consumer thread; idempotent.

Config (the edge's `extra` dict in the deploy YAML): `bootstrap` or `bootstrap.servers`
(default $CODECLOG_BOOTSTRAP), `topic` (default codec.chunks), `group_id` (default
codeclog-omni-stage<stage_id>), `delivery_timeout_ms` (30000), `linger_ms` (0), `kafka` (extra
librdkafka properties, e.g. security), `index_max_entries` (100000), `producer_id`.
librdkafka's own log lines go to the `codeclog.kafka` logger (codeclog.kafka.log), the
connector's to `codeclog.omni`; neither writes to stderr unless the process configures logging.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from codeclog.kafka.log import client_settings
from codeclog.omni.index import Entry, HandOutIndex, IndexKey
from codeclog.omni.payload import Decoded, PayloadError, decode_payload, encode_payload
from codeclog.producers.publisher import PublisherConfig, producer_settings
from codeclog.schemas import wire

LOGGER = logging.getLogger("codeclog.omni")
NAME = "CodeclogKafkaConnector"
DEFAULT_TOPIC = "codec.chunks"
POLL_S = 0.1
COMMIT_EVERY_S = 1.0
LAG_EVERY_S = 2.0


class CodeclogKafkaConnector:
    """An OmniConnector whose transport is a Kafka topic (see the module docstring)."""

    supports_raw_data = False  # payloads go through omni.payload, not raw RDMA buffers

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        config = dict(config or {})
        self.config = config
        self.stage_id = str(config.get("stage_id", ""))
        self.role = str(config.get("role", "dual"))
        bootstrap = config.get("bootstrap") or config.get("bootstrap.servers")
        bootstrap = bootstrap or os.environ.get("CODECLOG_BOOTSTRAP", "127.0.0.1:9092")
        self._client: dict[str, Any] = {
            "bootstrap.servers": str(bootstrap),
            **{str(k): str(v) for k, v in dict(config.get("kafka") or {}).items()},
        }
        self.topic = str(config.get("topic", DEFAULT_TOPIC))
        self.group_id = str(config.get("group_id") or f"codeclog-omni-stage{self.stage_id or 0}")
        self.producer_id = str(config.get("producer_id") or f"omni-{os.getpid()}")
        self.delivery_timeout_s = float(config.get("delivery_timeout_ms", 30_000)) / 1000.0
        self.linger_ms = float(config.get("linger_ms", 0))
        self.index_max_entries = int(config.get("index_max_entries", 100_000))
        self._lock = threading.Condition()
        self._producer: Any = None
        self._consumer_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        self._index = HandOutIndex(self.index_max_entries)  # omni.index: each key once
        self._counts: dict[str, int] = defaultdict(int)
        self._in_flight = 0
        self._lag: int | None = None
        self.last_error = ""

    # ------------------------------------------------------------------------------------- put
    def put(
        self, from_stage: str, to_stage: str, put_key: str, data: Any
    ) -> tuple[bool, int, dict[str, Any] | None]:
        try:
            return self._put(str(from_stage), str(to_stage), str(put_key), data)
        except Exception as exc:  # never raise into the engine
            self._failed("put", put_key, f"{type(exc).__name__}: {exc}")
            return False, 0, None

    def _put(
        self, from_stage: str, to_stage: str, put_key: str, data: Any
    ) -> tuple[bool, int, dict[str, Any] | None]:
        if self._closed:
            self._failed("put", put_key, "the connector is closed")
            return False, 0, None
        try:
            encoded = encode_payload(
                data,
                from_stage=from_stage,
                to_stage=to_stage,
                put_key=put_key,
                now_ms=time.time_ns() // 1_000_000,
                producer_id=self.producer_id,
            )
        except PayloadError as exc:
            self._failed("put", put_key, f"unsendable payload: {exc}")
            return False, 0, None
        done = threading.Event()
        result: dict[str, Any] = {}

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            result["err"] = err
            if err is None:
                result["partition"], result["offset"] = msg.partition(), msg.offset()
            done.set()

        producer = self._ensure_producer()
        with self._lock:
            self._in_flight += 1
        try:
            producer.produce(
                self.topic,
                encoded.value,
                encoded.request_id.encode("utf-8"),
                headers=encoded.headers,
                on_delivery=on_delivery,
            )
            deadline = time.monotonic() + self.delivery_timeout_s + 5.0
            while not done.is_set() and time.monotonic() < deadline:
                producer.poll(0.05)
        finally:
            with self._lock:
                self._in_flight -= 1
        err = result.get("err")
        if not done.is_set():
            self._failed("put", put_key, "no delivery report")
            return False, 0, None
        if err is not None:
            self._failed("put", put_key, f"{err.name()}: {err.str()}")
            return False, 0, None
        with self._lock:
            self._counts["puts"] += 1
            self._counts["put_bytes"] += encoded.size
        metadata = {
            "topic": self.topic,
            "partition": result["partition"],
            "offset": result["offset"],
            "record": encoded.record_type,
        }
        return True, encoded.size, metadata

    def _ensure_producer(self) -> Any:
        with self._lock:
            if self._producer is None:
                config = PublisherConfig(
                    self.topic,
                    producer_id=self.producer_id,
                    linger_ms=self.linger_ms,
                    delivery_timeout_ms=max(1, int(self.delivery_timeout_s * 1000)),
                )
                settings = producer_settings(self._client, config)
                settings["error_cb"] = self._client_error
                self._producer = Producer(settings)
            return self._producer

    def _client_error(self, err: KafkaError) -> None:
        with self._lock:
            self._counts["client_errors"] += 1
            self.last_error = f"{err.name()}: {err.str()}"

    def _failed(self, what: str, key: str, reason: str) -> None:
        LOGGER.error("codeclog connector %s %s failed: %s", what, key, reason)
        with self._lock:
            self._counts[f"{what}_failures"] += 1
            self.last_error = f"{what} {key}: {reason}"

    # ------------------------------------------------------------------------------------- get
    def get(
        self, from_stage: str, to_stage: str, get_key: str, metadata: dict[str, Any] | None = None
    ) -> tuple[Any, int] | None:
        try:
            self._ensure_consumer()
            with self._lock:
                return self._take((str(get_key), str(from_stage), str(to_stage)))
        except Exception as exc:
            self._failed("get", get_key, f"{type(exc).__name__}: {exc}")
            return None

    def get_with_deadline(
        self,
        from_stage: str,
        to_stage: str,
        get_key: str,
        metadata: dict[str, Any] | None = None,
        *,
        deadline: float,
    ) -> tuple[Any, int] | None:
        try:
            self._ensure_consumer()
            key = (str(get_key), str(from_stage), str(to_stage))
            with self._lock:
                while True:
                    found = self._take(key)
                    left = deadline - time.monotonic()
                    if found is not None or left <= 0 or self._closed:
                        return found
                    self._lock.wait(min(left, 0.5))
        except Exception as exc:
            self._failed("get", get_key, f"{type(exc).__name__}: {exc}")
            return None

    def abandon_get(self, get_key: str) -> None:
        return None

    def reap_consumed(self) -> None:
        return None

    def _take(self, key: IndexKey) -> tuple[Any, int] | None:
        entry = self._index.take(key)
        return None if entry is None else (entry.payload, entry.size)

    def cleanup(self, request_id: str) -> bool:
        request_id = str(request_id)
        with self._lock:
            self._index.forget(request_id)
            self._counts["cleanups"] += 1
        return True

    # -------------------------------------------------------------------------------- consumer
    def _ensure_consumer(self) -> None:
        with self._lock:
            if self._consumer_thread is not None or self._closed:
                return
            self._consumer_thread = threading.Thread(
                target=self._consume, name=f"codeclog-omni-{self.group_id}", daemon=True
            )
            self._consumer_thread.start()

    def _consume(self) -> None:
        consumer = Consumer(
            client_settings(
                self._client,
                {
                    "group.id": self.group_id,
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "error_cb": self._client_error,
                },
            )
        )
        consumer.subscribe([self.topic])
        next_commit = next_lag = time.monotonic()
        try:
            while not self._stop.is_set():
                for message in consumer.consume(64, POLL_S):
                    self._index_message(message)
                now = time.monotonic()
                if now >= next_commit:
                    self._commit(consumer)
                    next_commit = now + COMMIT_EVERY_S
                if now >= next_lag:
                    self._measure_lag(consumer)
                    next_lag = now + LAG_EVERY_S
            self._commit(consumer)
        except Exception as exc:
            self._failed("consume", self.topic, f"{type(exc).__name__}: {exc}")
        finally:
            consumer.close()

    def _index_message(self, message: Any) -> None:
        if message.error() is not None:
            if message.error().code() != KafkaError._PARTITION_EOF:
                self._failed("consume", self.topic, message.error().str())
            return
        partition, offset = message.partition(), message.offset()
        try:
            decoded = decode_payload(message.value(), message.headers())
        except (wire.DecodeError, PayloadError) as exc:
            self._failed("decode", f"{self.topic}[{partition}]@{offset}", str(exc))
            decoded = None
        with self._lock:
            self._index.read(partition, offset)
            if decoded is None:
                self._counts["skipped_records"] += 1
                return
            self._add(decoded, partition, offset, _size(message))
            self._lock.notify_all()

    def _add(self, decoded: Decoded, partition: int, offset: int, size: int) -> None:
        envelope = decoded.envelope
        key = (envelope.put_key, envelope.from_stage, envelope.to_stage)
        self._index.add(key, Entry(decoded.payload, size, partition, offset))  # once only

    def _commit(self, consumer: Any) -> None:
        # Commit below the oldest entry not handed out yet: a restarted receiver re-reads it.
        with self._lock:
            offsets = [
                TopicPartition(self.topic, p, offset)
                for p, offset in self._index.commit_offsets().items()
            ]
        if offsets:
            try:
                consumer.commit(offsets=offsets, asynchronous=True)
            except Exception as exc:  # e.g. no coordinator while the broker restarts
                with self._lock:
                    self.last_error = f"commit: {exc}"

    def _measure_lag(self, consumer: Any) -> None:
        lag = 0
        try:
            for tp in consumer.assignment():
                _low, high = consumer.get_watermark_offsets(tp, cached=True)
                position = self._index.read_position(tp.partition)
                if high >= 0:
                    lag += max(0, high - position)
        except Exception:
            return
        with self._lock:
            self._lag = lag

    # ------------------------------------------------------------------------------- lifecycle
    def health(self) -> dict[str, Any]:
        with self._lock:
            failures = sum(v for k, v in self._counts.items() if k.endswith("_failures"))
            return {
                "status": "closed" if self._closed else ("degraded" if failures else "ok"),
                "connector": NAME,
                "topic": self.topic,
                "group_id": self.group_id,
                "role": self.role,
                "stage_id": self.stage_id,
                "consumer_running": self._consumer_thread is not None and not self._stop.is_set(),
                "lag": self._lag,
                "in_flight": self._in_flight,
                "index_entries": len(self._index),
                "failures": failures,
                "last_error": self.last_error,
                **dict(self._counts),
                **dict(self._index.counts),
            }

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
        self._stop.set()
        thread = self._consumer_thread
        if thread is not None:
            thread.join(timeout=30.0)
        producer = self._producer
        if producer is not None:
            left = producer.flush(min(self.delivery_timeout_s, 10.0))
            if left:
                LOGGER.error("codeclog connector closed with %d undelivered records", left)

    def __enter__(self) -> CodeclogKafkaConnector:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _size(message: Any) -> int:
    value = message.value() or b""
    return len(value) + sum(len(v or b"") for _k, v in message.headers() or ())
