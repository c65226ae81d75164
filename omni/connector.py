"""`CodeclogKafkaConnector`: a vllm-omni OmniConnector on a durable Kafka topic.

A subclass of vllm-omni's `OmniConnectorBase` where `vllm_omni` is importable (it then has the
base's `serialize_obj`, `deserialize_obj`, `_make_key`, context manager and destructor); a plain
class with the same interface otherwise, so codeclog never imports vllm-omni where it is not
installed. The plugin (`codeclog.omni.plugin`) registers it with vllm-omni's connector factory.
docs/vllm-omni.md is the user's guide.

- put: one record keyed by the external request id of the put key, on an idempotent producer with
  acks=all (`producers.publisher.producer_settings`); returns (True, size, metadata) only after the
  broker acknowledged it, else (False, 0, None) with the reason logged and counted. It never
  raises. On the MiniCPM-o talker -> Code2Wav edge payloads travel as CodecChunk records (and
  the adapter's end markers as FINISH control events), anything else as a PayloadEnvelope
  (omni.payload). An instance that also receives indexes its own put at once.
- get / get_with_deadline: served from an in-memory index (omni.index) that a background
  consumer fills (read_committed, one group per replica, started with the connector unless its
  role is "sender"). get never blocks; get_with_deadline waits until the monotonic deadline at
  most. A key is handed out once, as vllm-omni's shared-memory connector does; what the index
  keeps of a request ends with the request (its terminal payload handed out, `cleanup`, or
  `request_idle_s` of nothing), since vllm-omni calls `cleanup` for shared memory only.
- health(): counters, lag, last error; close(): flushes the producer and stops the consumer
  thread; idempotent.

Config (the edge's `extra` dict in the deploy YAML, plus the `stage_id` and `role` vllm-omni
adds): `bootstrap` or `bootstrap.servers` (default $CODECLOG_BOOTSTRAP), `topic` (default
codec.chunks), `group_id` (default codeclog-omni-stage<stage_id>; `-replica<N>` appended, or
`{replica}` replaced), `replica_id` (default $VLLM_OMNI_REPLICA_ID, else 0), `codec_edge`
(default: true where `codec_chunk_frames` is set), `delivery_timeout_ms` (30000), `linger_ms`
(0), `kafka` (extra librdkafka properties, e.g. security), `index_max_entries` (100000),
`request_idle_s` (600), `producer_id`. librdkafka's own log lines go to the `codeclog.kafka`
logger (codeclog.kafka.log), the connector's to `codeclog.omni`; neither writes to stderr
unless the process configures logging.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

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
DEFAULT_IDLE_S = 600.0  # a request nothing was indexed or handed out of for this long is dropped
REPLICA_ENV = "VLLM_OMNI_REPLICA_ID"  # set by vllm-omni in every stage engine process
BASE_MODULE = "vllm_omni.distributed.omni_connectors.connectors.base"


def _connector_base() -> type:
    """vllm-omni's `OmniConnectorBase` when vllm_omni is importable, else `object`."""
    if importlib.util.find_spec("vllm_omni") is None:
        return object
    try:
        module = importlib.import_module(BASE_MODULE)
    except Exception as exc:  # an installation vLLM itself could not run either
        LOGGER.warning("vllm_omni is installed but %s does not import: %s", BASE_MODULE, exc)
        return object
    base = getattr(module, "OmniConnectorBase", object)
    return base if isinstance(base, type) else object


if TYPE_CHECKING:
    _Base = object
else:
    _Base = _connector_base()


class CodeclogKafkaConnector(_Base):
    """An OmniConnector whose transport is a Kafka topic (see the module docstring)."""

    supports_raw_data = False  # payloads go through omni.payload, not raw RDMA buffers

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        config = dict(config or {})
        self.config = config
        self.stage_id = _stage_id(config.get("stage_id", -1))  # the adapter computes +1 / -1
        self.role = str(config.get("role", "dual"))
        bootstrap = config.get("bootstrap") or config.get("bootstrap.servers")
        bootstrap = bootstrap or os.environ.get("CODECLOG_BOOTSTRAP", "127.0.0.1:9092")
        self._client: dict[str, Any] = {
            "bootstrap.servers": str(bootstrap),
            **{str(k): str(v) for k, v in dict(config.get("kafka") or {}).items()},
        }
        self.topic = str(config.get("topic", DEFAULT_TOPIC))
        self.replica_id = _replica_id(config)
        self.group_id = _group_id(config, self.stage_id, self.replica_id)
        self.codec_edge = _codec_edge(config)
        self.producer_id = str(config.get("producer_id") or f"omni-{os.getpid()}")
        self.delivery_timeout_s = float(config.get("delivery_timeout_ms", 30_000)) / 1000.0
        self.linger_ms = float(config.get("linger_ms", 0))
        self.index_max_entries = int(config.get("index_max_entries", 100_000))
        self.idle_s = float(config.get("request_idle_s", DEFAULT_IDLE_S))
        self._lock = threading.Condition()
        self._producer: Any = None
        self._consumer_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        self._index = HandOutIndex(self.index_max_entries, self.idle_s)  # omni.index
        self._counts: dict[str, int] = defaultdict(int)
        self._in_flight = 0
        self._lag: int | None = None
        self.last_error = ""
        if self.role != "sender":
            self._ensure_consumer()  # caught up by the time the adapter polls its first key

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
                codec_edge=self.codec_edge,
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
        if self.role != "sender":  # this instance receives too: its own put is readable now
            self._index_record(
                encoded.value, encoded.headers, result["partition"], result["offset"], False
            )
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

    def _consume_error(self, error: KafkaError) -> None:
        """A consumer error librdkafka recovers from by itself: counted and told, once per
        kind, not a failure (a topic whose metadata has not reached this client yet)."""
        text = f"{error.name()}: {error.str()}"
        with self._lock:
            self._counts["consume_errors"] += 1
            told = self.last_error == text
            self.last_error = text
        if not told:
            LOGGER.warning("codeclog connector consuming %s: %s (retrying)", self.topic, text)

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
        entry = self._index.take(key, time.monotonic())
        return None if entry is None else (entry.payload, entry.size)

    def cleanup(self, request_id: str) -> bool:
        """Forget a request (its id), or one put key (vllm-omni 0.30's shared-memory form)."""
        with self._lock:
            self._index.forget(str(request_id))
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
        consumer.subscribe([self.topic], on_assign=self._on_assign)
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
                    with self._lock:
                        self._index.expire(now)
                    next_lag = now + LAG_EVERY_S
            self._commit(consumer)
        except Exception as exc:
            self._failed("consume", self.topic, f"{type(exc).__name__}: {exc}")
        finally:
            consumer.close()

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Resume where this receiver read up to, so a rebalance never re-reads in-process."""
        with self._lock:
            for tp in partitions:
                position = self._index.read_position(tp.partition)
                if position > 0:
                    tp.offset = position
        consumer.assign(partitions)

    def _index_message(self, message: Any) -> None:
        error = message.error()
        if error is not None:
            if error.fatal():
                self._failed("consume", self.topic, error.str())
            elif error.code() != KafkaError._PARTITION_EOF:
                self._consume_error(error)  # librdkafka retries: e.g. a topic just created
            return
        partition, offset = message.partition(), message.offset()
        self._index_record(message.value(), message.headers(), partition, offset, True)

    def _index_record(
        self, value: bytes | None, headers: Any, partition: int, offset: int, consumed: bool
    ) -> None:
        """Index one record: read by the consumer (`consumed`) or just put by this instance."""
        try:
            decoded = decode_payload(value, headers)
        except (wire.DecodeError, PayloadError) as exc:
            self._failed("decode", f"{self.topic}[{partition}]@{offset}", str(exc))
            decoded = None
        size = len(value or b"") + sum(len(v or b"") for _k, v in headers or ())
        with self._lock:
            if consumed:
                self._index.read(partition, offset)
            if decoded is None:
                self._counts["skipped_records"] += 1
                return
            self._add(decoded, partition, offset, size)
            self._lock.notify_all()

    def _add(self, decoded: Decoded, partition: int, offset: int, size: int) -> None:
        envelope = decoded.envelope
        key = (envelope.put_key, envelope.from_stage, envelope.to_stage)
        entry = Entry(decoded.payload, size, partition, offset, decoded.terminal)
        self._index.add(key, entry, time.monotonic())  # once only

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
                "index_requests": self._index.requests,
                "handed_keys": self._index.handed,
                "replica_id": self.replica_id,
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


def _stage_id(value: Any) -> Any:
    """The stage id as vllm-omni keeps it: an int (the chunk adapter computes stage_id - 1)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


def _replica_id(config: Mapping[str, Any]) -> int:
    """Which replica of its stage this process is: `replica_id` in the config, else the
    VLLM_OMNI_REPLICA_ID vllm-omni sets in every stage engine process, else 0."""
    raw = config.get("replica_id", os.environ.get(REPLICA_ENV, "0"))
    try:
        return max(int(raw), 0)
    except (TypeError, ValueError):
        return 0


def _group_id(config: Mapping[str, Any], stage_id: Any, replica_id: int) -> str:
    """The receiver's consumer group: one per replica, so each reads every partition and hands
    out the keys of the requests vllm-omni routed to it. `{replica}` in `group_id` places the
    replica id; without it, `-replica<N>` is appended."""
    stage = f"-stage{stage_id}" if isinstance(stage_id, int) and stage_id >= 0 else ""
    base = str(config.get("group_id") or f"codeclog-omni{stage}")
    if "{replica}" in base:
        return base.replace("{replica}", str(replica_id))
    return f"{base}-replica{replica_id}"


def _codec_edge(config: Mapping[str, Any]) -> bool | None:
    """Whether this edge is MiniCPM-o's talker -> Code2Wav (omni.payload): `codec_edge` in the
    config, else True where the config carries the codec windowing the MiniCPM-o processor
    reads from it (`codec_chunk_frames`), else None: decided per payload."""
    explicit = config.get("codec_edge")
    if explicit is not None:
        return str(explicit).lower() in ("1", "true", "yes")
    return True if "codec_chunk_frames" in config else None
