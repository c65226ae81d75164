"""The connector's sending side: one record per `put`, acknowledged before `put` returns."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Producer

from codeclog.omni.payload import Encoded, PayloadError, encode_payload
from codeclog.omni.settings import ConnectorSettings
from codeclog.omni.tally import Tally
from codeclog.producers.publisher import PublisherConfig, producer_settings

Delivered = tuple[int, int]  # (partition, offset) of an acknowledged record


@dataclasses.dataclass(frozen=True, slots=True)
class Put:
    """A record the broker acknowledged: what was written, and where."""

    encoded: Encoded
    partition: int
    offset: int


class Sender:
    """Puts payloads on the edge's topic: one record per `put`, on an idempotent producer with
    acks=all (`producers.publisher.producer_settings`); the receiving side writes its hand-out
    ledger's marks through the same producer (`produce`)."""

    def __init__(self, settings: ConnectorSettings, tally: Tally) -> None:
        self.settings = settings
        self.tally = tally
        self._lock = threading.Lock()
        self._producer: Any = None
        self.in_flight = 0

    def put(self, from_stage: str, to_stage: str, put_key: str, data: Any) -> Put | None:
        """The record once the broker acknowledged it, or None with the failure logged and
        counted."""
        try:
            encoded = encode_payload(
                data,
                from_stage=from_stage,
                to_stage=to_stage,
                put_key=put_key,
                now_ms=time.time_ns() // 1_000_000,
                producer_id=self.settings.producer_id,
                codec_edge=self.settings.codec_edge,
            )
        except PayloadError as exc:
            self.tally.failed("put", put_key, f"unsendable payload: {exc}")
            return None
        delivered = self._deliver(put_key, encoded)
        if delivered is None:
            return None
        self.tally.add("puts")
        self.tally.add("put_bytes", encoded.size)
        return Put(encoded, *delivered)

    def _deliver(self, put_key: str, encoded: Encoded) -> Delivered | None:
        done = threading.Event()
        result: dict[str, Any] = {}

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            result["err"] = err
            if err is None:
                result["at"] = (msg.partition(), msg.offset())
            done.set()

        producer = self.producer()
        with self._lock:
            self.in_flight += 1
        try:
            producer.produce(
                self.settings.topic,
                encoded.value,
                encoded.request_id.encode("utf-8"),
                headers=encoded.headers,
                on_delivery=on_delivery,
            )
            deadline = time.monotonic() + self.settings.delivery_timeout_s + 5.0
            while not done.is_set() and time.monotonic() < deadline:
                producer.poll(0.05)
        finally:
            with self._lock:
                self.in_flight -= 1
        err = result.get("err")
        if not done.is_set():
            self.tally.failed("put", put_key, "no delivery report")
            return None
        if err is not None:
            self.tally.failed("put", put_key, f"{err.name()}: {err.str()}")
            return None
        at: Delivered = result["at"]
        return at

    def produce(
        self, topic: str, key: bytes, value: bytes, on_delivery: Callable[[Any, Any], None]
    ) -> None:
        """Queue one record without waiting (the ledger's marks); `poll` serves the report."""
        self.producer().produce(topic, value, key, on_delivery=on_delivery)

    def poll(self) -> None:
        with self._lock:
            producer = self._producer
        if producer is not None:
            producer.poll(0)

    def producer(self) -> Any:
        with self._lock:
            if self._producer is None:
                config = PublisherConfig(
                    self.settings.topic,
                    producer_id=self.settings.producer_id,
                    linger_ms=self.settings.linger_ms,
                    delivery_timeout_ms=max(1, int(self.settings.delivery_timeout_s * 1000)),
                )
                client = producer_settings(self.settings.client, config)
                client["error_cb"] = self._client_error
                self._producer = Producer(client)
            return self._producer

    def _client_error(self, err: KafkaError) -> None:
        self.tally.error(f"{err.name()}: {err.str()}", "client_errors")

    def close(self) -> int:
        """Flush what is queued; the records left undelivered."""
        with self._lock:
            producer = self._producer
        if producer is None:
            return 0
        left: int = producer.flush(min(self.settings.delivery_timeout_s, 10.0))
        return left
