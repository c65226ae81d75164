"""Mode 2's return path: each vllm-omni request's audio, from codeclog's audio topic, in order,
each window once, with its end, or its failure with the reason (`ReturnRouter`, `AudioReturn`).
Reasons: docs/vllm-omni.md, "Mode 2 end to end"."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from codeclog.consumers.readers.deliveries import ListenerChunk, ListenerConfig
from codeclog.consumers.readers.listener import AudioListener, Isolation, ListenerError, StartMode
from codeclog.kafka.log import client_settings
from codeclog.schemas import catalog, wire
from codeclog.schemas.records import ControlEvent, ControlKind, DeadLetter

LOGGER = logging.getLogger("codeclog.omni")
POLL_S = 0.05
CONTROL = catalog.fingerprint_of(ControlEvent)


@dataclasses.dataclass(frozen=True, slots=True)
class Window:
    """One window of a request's audio: 16-bit PCM, as the audio topic holds it."""

    request_id: str  # the id vllm-omni knows the request by
    pcm: bytes
    sample_rate_hz: int
    final: bool  # the request's audio ends with it
    chunk: ListenerChunk


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    request_id: str
    reason: str


Event = Window | Failure


@dataclasses.dataclass(slots=True)
class _Waiting:
    internal_id: str
    since: float  # registration or the last window (monotonic s)


class ReturnRouter:
    """Registered requests and what comes for them; no I/O, no lock.

    Requests are registered by the id vllm-omni knows them by (the stage's internal request id)
    under their external id (the Kafka key). A window (`AudioListener`'s delivery: per request
    and epoch, in window order, each once) is a `Window` of the request; the epoch's final window
    ends it (`Window.final`). A dead letter of one of its chunks (a refused chunk, an eviction),
    an ABORT on the chunk topic (the talker hook could not deliver its chunks), a stream the
    listener ended without its final window (idle, evicted), windows never written before the
    one delivered (a gap), or nothing for `wait_s` since it was registered or since its last
    window: a `Failure` with the reason, and the request is forgotten."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._by_external: dict[str, _Waiting] = {}
        self.counts: dict[str, int] = {"windows": 0, "finished": 0, "failed": 0}

    def __len__(self) -> int:
        return len(self._by_external)

    def register(self, internal_id: str, external_id: str, now: float) -> None:
        self._by_external[external_id] = _Waiting(internal_id, now)

    def unregister(self, internal_id: str) -> None:
        for external, waiting in list(self._by_external.items()):
            if waiting.internal_id == internal_id:
                del self._by_external[external]

    def on_chunk(self, chunk: ListenerChunk, now: float) -> list[Event]:
        waiting = self._by_external.get(chunk.request_id)
        if waiting is None:
            return []
        if chunk.gap_samples:
            return self._fail(chunk.request_id, f"{chunk.gap_samples} samples never written")
        if not chunk.pcm and chunk.end not in (None, "final"):
            return self._fail(
                chunk.request_id, f"its audio stream ended without audio: {chunk.end}"
            )
        waiting.since = now
        final = chunk.final or chunk.end == "final"
        self.counts["windows"] += 1
        window = Window(waiting.internal_id, chunk.pcm, chunk.sample_rate_hz, final, chunk)
        if final:
            del self._by_external[chunk.request_id]
            self.counts["finished"] += 1
        return [window]

    def on_dead_letter(self, letter: DeadLetter) -> list[Event]:
        external = letter.request_id or (letter.raw_key or b"").decode("utf-8", "replace")
        if external not in self._by_external:
            return []
        where = f"chunk_seq {letter.chunk_seq}" if letter.chunk_seq is not None else "a record"
        return self._fail(external, f"{where} was dead-lettered: {letter.reason}")

    def on_abort(self, event: ControlEvent) -> list[Event]:
        if event.request_id not in self._by_external:
            return []
        return self._fail(event.request_id, f"aborted on the log: {event.reason or 'abort'}")

    def expire(self, now: float) -> list[Event]:
        """Fail the requests nothing came for in `wait_s` (0: no bound)."""
        if self.wait_s <= 0:
            return []
        late = [e for e, w in self._by_external.items() if now - w.since >= self.wait_s]
        events: list[Event] = []
        for external in late:
            events += self._fail(external, f"no audio for {self.wait_s:g} s (request_wait_s)")
        return events

    def _fail(self, external: str, reason: str) -> list[Event]:
        waiting = self._by_external.pop(external)
        self.counts["failed"] += 1
        return [Failure(waiting.internal_id, f"codeclog: request {external}: {reason}")]


@dataclasses.dataclass(frozen=True)
class ReturnConfig:
    """Where the audio and the failures are, and how to read them."""

    client: dict[str, str]
    audio_topic: str = "codec.audio"
    dlq_topic: str = "codec.dlq"
    chunks_topic: str = "codec.chunks"
    isolation: Isolation = Isolation.COMMITTED
    wait_s: float = 60.0

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> ReturnConfig:
        """$CODECLOG_BOOTSTRAP, $CODECLOG_TOPIC (the chunk topic, as the talker hook reads it),
        $CODECLOG_AUDIO_TOPIC, $CODECLOG_DLQ_TOPIC, $CODECLOG_AUDIO_ISOLATION (committed or
        speculative), $CODECLOG_REQUEST_WAIT_S."""
        return cls(
            client={"bootstrap.servers": environ.get("CODECLOG_BOOTSTRAP", "127.0.0.1:9092")},
            audio_topic=environ.get("CODECLOG_AUDIO_TOPIC", cls.audio_topic),
            dlq_topic=environ.get("CODECLOG_DLQ_TOPIC", cls.dlq_topic),
            chunks_topic=environ.get("CODECLOG_TOPIC", cls.chunks_topic),
            isolation=Isolation(environ.get("CODECLOG_AUDIO_ISOLATION", "committed")),
            wait_s=float(environ.get("CODECLOG_REQUEST_WAIT_S", cls.wait_s)),
        )


class AudioReturn:
    """A `ReturnRouter` fed from Kafka on its own thread; `sink` gets every event (omni.relay
    turns them into the engine outputs vllm-omni's Code2Wav stage would have made)."""

    def __init__(self, config: ReturnConfig, sink: Callable[[Sequence[Event]], None]) -> None:
        self.config = config
        self.sink = sink
        self.router = ReturnRouter(config.wait_s)
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.error = ""

    def start(self, timeout_s: float = 30.0) -> None:
        """Start reading from the topics' ends; returns once both readers are assigned."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="codeclog-return", daemon=True)
            self._thread.start()
        self._ready.wait(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def register(self, internal_id: str, external_id: str) -> None:
        with self.lock:
            self.router.register(internal_id, external_id, time.monotonic())

    def unregister(self, internal_id: str) -> None:
        with self.lock:
            self.router.unregister(internal_id)

    def _run(self) -> None:
        config = self.config
        listener = AudioListener(
            config.client,
            config.audio_topic,
            isolation=config.isolation,
            config=ListenerConfig(idle_end_s=max(config.wait_s, 1.0) * 2),
            start=StartMode.END,
        )
        failures = _FailureReader(config)
        try:
            listener.start()
            failures.start()
            self._ready.set()
            while not self._stop.is_set():
                self._pass(listener, failures)
        except (ListenerError, KafkaException) as exc:
            self.error = str(exc)
            LOGGER.error("codeclog audio return stopped: %s", exc)
        finally:
            self._ready.set()
            listener.close()
            failures.close()

    def _pass(self, listener: AudioListener, failures: _FailureReader) -> None:
        chunks = listener.poll(POLL_S)
        records = failures.poll()
        now = time.monotonic()
        events: list[Event] = []
        with self.lock:
            for chunk in chunks:
                events += self.router.on_chunk(chunk, now)
            for record in records:
                if isinstance(record, DeadLetter):
                    events += self.router.on_dead_letter(record)
                elif record.kind is ControlKind.ABORT:
                    events += self.router.on_abort(record)
            events += self.router.expire(now)
        if events:
            self.sink(events)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30.0)


class _FailureReader:
    """The dead letters and the chunk topic's ABORTs written from now on (no group)."""

    def __init__(self, config: ReturnConfig) -> None:
        self.config = config
        self._consumer: Any = None

    def start(self) -> None:
        consumer = Consumer(
            client_settings(
                self.config.client,
                {
                    "group.id": "codeclog-audio-return",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "fetch.wait.max.ms": 50,
                },
            )
        )
        places = []
        for topic in (self.config.dlq_topic, self.config.chunks_topic):
            metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is None or metadata.error is not None:
                LOGGER.warning("codeclog audio return: %s is not readable: skipped", topic)
                continue
            places += [TopicPartition(topic, p, OFFSET_END) for p in metadata.partitions]
        consumer.assign(places)
        self._consumer = consumer

    def poll(self) -> list[DeadLetter | ControlEvent]:
        out: list[DeadLetter | ControlEvent] = []
        for message in self._consumer.consume(500, 0):
            if message.error() is not None:
                if message.error().code() != KafkaError._PARTITION_EOF:
                    LOGGER.warning("codeclog audio return: %s", message.error())
                continue
            record = _failure_record(message.topic() == self.config.dlq_topic, message.value())
            if record is not None:
                out.append(record)
        return out

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _failure_record(dead_letter: bool, value: bytes | None) -> DeadLetter | ControlEvent | None:
    """A dead letter, or an ABORT of the chunk topic (its codec chunks are not decoded)."""
    if not dead_letter and wire.wire_fingerprint(value) != CONTROL:
        return None
    try:
        record = wire.decode(value)
    except wire.DecodeError:
        return None
    if isinstance(record, DeadLetter | ControlEvent):
        return record
    return None
