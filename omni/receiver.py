"""The connector's receiving side: a background consumer fills the index, gets are served from it.

The consumer reads the edge's chunk topic and its hand-out ledger (omni.ledger) with
read_committed, in one consumer group per replica of the receiving stage, with static
membership (`group.instance.id`): a process that replaces a dead one under the same replica
identity gets its partitions at once, not after the dead member's session timeout.

A receiver starts by taking over its group: it reads its group's marks from the committed ledger
floor to the ledger's end before it reads any chunk (the chunk partitions stay paused), so a
request that ended at a predecessor is neither indexed nor handed out again (omni.index).
Every request that had not ended is read again from its first record (the group's commit stays
below it) and handed out from chunk 0 as the adapter asks for it.

A request the adapter waits on, whose next chunk has not arrived for `request_wait_s`, fails:
through the adapter's receive-failure path (`record_receive_failure`, which vllm-omni's
scheduler turns into FINISHED_ERROR with the reason) when the adapter was bound to this
connector (omni.plugin does it in vLLM processes), else through a terminal payload (the
adapter's own end-marker shape, with the reason under `meta.codeclog_error`). The same for a
request asked for after it ended. Either is logged and counted by request id in `health()`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from codeclog.kafka.log import client_settings
from codeclog.omni import ledger
from codeclog.omni.failures import RequestFailures
from codeclog.omni.index import TIMED_OUT, Entry, HandOutIndex, IndexKey
from codeclog.omni.payload import PayloadError, decode_payload
from codeclog.omni.sender import Put, Sender
from codeclog.omni.settings import ConnectorSettings
from codeclog.omni.takeover import Takeover
from codeclog.omni.tally import Tally
from codeclog.schemas import wire
from codeclog.schemas.records import HandOutMove

LOGGER = logging.getLogger("codeclog.omni")
POLL_S = 0.1
COMMIT_EVERY_S = 1.0
LAG_EVERY_S = 2.0
CHECK_EVERY_S = 0.25
RETRY_S = 2.0
METADATA_REFRESH_MS = 5000


class Receiver:
    """Serves the adapter's gets (module docstring)."""

    def __init__(self, settings: ConnectorSettings, tally: Tally, sender: Sender) -> None:
        self.settings = settings
        self.tally = tally
        self.sender = sender
        self.ledger = ledger.ledger_topic(settings.topic)
        self.cond = threading.Condition()
        self.index = HandOutIndex(settings.index_max_entries, settings.idle_s)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.closed = False
        self.lag: int | None = None
        self._recovery = Takeover(settings.topic, self.ledger)
        self.failures = RequestFailures(tally)
        self.marks = ledger.MarkWriter(settings, sender, tally, self._marked)

    # ------------------------------------------------------------------------------ serving
    def take(self, key: IndexKey) -> tuple[Any, int] | None:
        """The payload of `key` and its size, once; None while it is not here."""
        now = time.monotonic()
        terminal = self.failures.terminal(key)
        if terminal is not None:
            return terminal, 0
        with self.cond:
            entry = self.index.take(key, now, self._recovery.synced_at)
        if entry is None:
            return None
        if entry.terminal:
            self._write_marks()  # queued now, not at the consumer's next pass: the window in
            # which a kill leaves a request ended here but not on the ledger is a round trip
        return entry.payload, entry.size

    def take_by(self, key: IndexKey, deadline: float) -> tuple[Any, int] | None:
        """As `take`, waiting until the monotonic `deadline` at most."""
        while True:
            found = self.take(key)
            left = deadline - time.monotonic()
            if found is not None or left <= 0 or self.closed:
                return found
            with self.cond:
                self.cond.wait(min(left, 0.5))

    def own_put(self, put: Put) -> None:
        """A record this instance put: readable at once (the consumer reads it again later)."""
        self._index_record(put.encoded.value, put.encoded.headers, put.partition, put.offset, False)

    def forget(self, name: str) -> None:
        with self.cond:
            self.index.forget(name, time.monotonic())

    def bind(self, adapter: Any) -> None:
        """The chunk adapter this connector serves: requests fail through its
        `record_receive_failure` (the scheduler ends them as FINISHED_ERROR)."""
        self.failures.bind(adapter)

    # ----------------------------------------------------------------------------- consumer
    def start(self) -> None:
        with self.cond:
            if self._thread is not None or self.closed:
                return
            self._thread = threading.Thread(
                target=self._consume, name=f"codeclog-omni-{self.settings.group_id}", daemon=True
            )
            self._thread.start()

    def _consume(self) -> None:
        consumer = self._open()
        if consumer is None:
            return
        timers = {"commit": 0.0, "lag": 0.0, "check": 0.0}
        try:
            while not self._stop.is_set():
                for message in consumer.consume(64, POLL_S):
                    self._on_message(message)
                self._tick(consumer, time.monotonic(), timers)
            self._write_marks()
            self.sender.poll()
            self._commit(consumer)
        except Exception as exc:
            self.tally.failed("consume", self.settings.topic, f"{type(exc).__name__}: {exc}")
        finally:
            consumer.close()

    def _open(self) -> Any:
        """The group's consumer, subscribed once the ledger exists (None: closed first)."""
        while not self._stop.is_set():
            try:
                ledger.ensure_ledger(self.settings.client, self.settings.topic)
                break
            except KafkaException as exc:
                if self.tally.error(f"ledger {self.ledger}: {exc}", "ledger_errors"):
                    LOGGER.warning("codeclog connector: ledger %s: %s (retrying)", self.ledger, exc)
                self._stop.wait(RETRY_S)
        if self._stop.is_set():
            return None
        self.sender.producer()  # connected before the first mark: a mark waits for nothing
        consumer = Consumer(group_settings(self.settings, self._client_error))
        consumer.subscribe([self.settings.topic, self.ledger], on_assign=self._on_assign)
        return consumer

    def _tick(self, consumer: Any, now: float, timers: dict[str, float]) -> None:
        self.sender.poll()  # the marks' delivery reports
        if self._recovery.active:
            self._recover(consumer, now)
        self._sync_ledger(consumer, now)
        self._write_marks()
        if now >= timers["check"]:  # while taking over too: the log may be out of reach
            self._enforce_waits(now)
            timers["check"] = now + CHECK_EVERY_S
        if now >= timers["commit"]:
            self._commit(consumer)
            timers["commit"] = now + COMMIT_EVERY_S
        if now >= timers["lag"]:
            self._measure_lag(consumer)
            with self.cond:
                self.index.expire(now)
            self.failures.drop_stale(now, self.settings.idle_s)
            timers["lag"] = now + LAG_EVERY_S

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Resume where this receiver read up to, so a rebalance never re-reads in-process;
        while it takes over, the chunk partitions wait for the ledger (omni.takeover)."""
        with self.cond:
            for tp in partitions:
                if tp.topic == self.ledger:
                    position = self._recovery.ledger_read
                else:
                    position = self.index.read_position(tp.partition)
                if position > 0:
                    tp.offset = position
        consumer.assign(partitions)
        self._recovery.assigned_to(consumer, partitions, self.settings.instance_id)

    def _recover(self, consumer: Any, now: float) -> None:
        with self.cond:
            done = self._recovery.advance(consumer)
            if not done:
                return
            self.index.restart_waits(now)
            restored = self.index.counts["restored_endings"]
        LOGGER.info(
            "codeclog connector %s took over its group (%d endings read from the ledger)",
            self.settings.instance_id,
            restored,
        )

    def _sync_ledger(self, consumer: Any, now: float) -> None:
        """The index's ledger gate (omni.takeover, `sync`): read the ledger to an end learnt
        after the first ask of each request waiting there."""
        with self.cond:
            since = self.index.gate_since(self._recovery.synced_at)
        if since is None:
            return
        moved = self._recovery.sync(consumer, since, now)
        if moved:
            with self.cond:
                self.cond.notify_all()

    # ----------------------------------------------------------------------------- messages
    def _on_message(self, message: Any) -> None:
        error = message.error()
        if error is not None:
            if error.fatal():
                self.tally.failed("consume", self.settings.topic, error.str())
            elif error.code() != KafkaError._PARTITION_EOF:
                retried(self.tally, self.settings.topic, error)  # e.g. a topic just created
            return
        if message.topic() == self.ledger:
            self._on_mark(message.value(), message.offset())
        else:
            partition, offset = message.partition(), message.offset()
            self._index_record(message.value(), message.headers(), partition, offset, True)

    def _on_mark(self, value: bytes | None, offset: int) -> None:
        decoded = ledger.decode_mark(value, offset, time.monotonic())
        with self.cond:
            self._recovery.read(offset)
            if decoded is None:
                return
            if isinstance(decoded, HandOutMove):
                self.index.moved(decoded.request_id, time.monotonic())
                self.cond.notify_all()
                return
            group, ending = decoded
            if group != self.settings.group_id:
                self.index.ended_elsewhere(ending)
            elif self._recovery.active:  # a predecessor's (after it: this process's own)
                self.index.restore(ending)

    def _index_record(
        self, value: bytes | None, headers: Any, partition: int, offset: int, consumed: bool
    ) -> None:
        """Index one record: read by the consumer (`consumed`) or just put by this instance."""
        where = f"{self.settings.topic}[{partition}]@{offset}"
        try:
            decoded = decode_payload(value, headers)
        except (wire.DecodeError, PayloadError) as exc:
            self.tally.failed("decode", where, str(exc))
            decoded = None
        size = len(value or b"") + sum(len(v or b"") for _k, v in headers or ())
        with self.cond:
            if consumed:
                self.index.read(partition, offset)
            if decoded is None:
                self.tally.add("skipped_records")
                return
            envelope = decoded.envelope
            key = (envelope.put_key, envelope.from_stage, envelope.to_stage)
            entry = Entry(decoded.payload, size, partition, offset, decoded.terminal)
            self.index.add(key, entry, time.monotonic(), own=not consumed)  # once only
            self.cond.notify_all()

    def _client_error(self, err: KafkaError) -> None:
        self.tally.error(f"{err.name()}: {err.str()}", "client_errors")

    # ------------------------------------------------------------------------------- marks
    def _write_marks(self) -> None:
        """Queue the ledger marks of the requests that ended since the last pass."""
        with self.cond:
            due, self.index.marks_due = self.index.marks_due, []
        again = self.marks.write(due)
        if again:
            with self.cond:
                self.index.marks_due.extend(again)

    def _marked(self, request: str, offset: int) -> None:
        with self.cond:
            self.index.marked(request, offset)
            self._recovery.ledger_end = max(self._recovery.ledger_end, offset + 1)

    # ------------------------------------------------------------------------------ commits
    def _commit(self, consumer: Any) -> None:
        """Below the first record of every request held; the ledger at its floor."""
        topic = self.settings.topic
        with self.cond:
            offsets = [TopicPartition(topic, p, o) for p, o in self.index.commit_offsets().items()]
            if offsets and not self._recovery.active:
                floor = self.index.ledger_floor(self._recovery.ledger_end, time.monotonic())
                offsets.append(TopicPartition(self.ledger, 0, floor))
        if offsets:
            try:
                consumer.commit(offsets=offsets, asynchronous=True)
            except Exception as exc:  # e.g. no coordinator while the broker restarts
                self.tally.error(f"commit: {exc}")

    def _measure_lag(self, consumer: Any) -> None:
        """Records of the chunk topic not read yet (librdkafka's cached watermarks)."""
        lag = 0
        try:
            for tp in consumer.assignment():
                if tp.topic == self.settings.topic:
                    _low, high = consumer.get_watermark_offsets(tp, cached=True)
                    lag += max(0, high - self.index.read_position(tp.partition))
        except Exception:
            return
        with self.cond:
            self.lag = lag

    # ----------------------------------------------------------------------------- failures
    def _enforce_waits(self, now: float) -> None:
        """Fail the requests the adapter waited on for `request_wait_s`, and the ones it asks
        for after they ended."""
        wait_s = self.settings.wait_s
        failing: list[tuple[str, IndexKey | None, str]] = []
        with self.cond:
            for request in self.index.overdue(now, wait_s):
                key = self.index.asked_key(request)
                self.index.end(request, TIMED_OUT, now)
                reason = (
                    f"no chunk of request {request} for {wait_s:g} s (request_wait_s): "
                    "its talker stopped or the log is out of reach"
                )
                failing.append((request, key, reason))
                self.tally.add("timed_out")
            for request, key in self.index.asked_after_end(self._recovery.synced_at):
                ending = self.index.ending(request)
                how = ending.reason if ending is not None else "ended"
                reason = f"request {request} ended on this edge before ({how}): not handed again"
                failing.append((request, key, reason))
                self.tally.add("asked_after_end")
        for request, key, reason in failing:
            self.failures.fail(request, key, reason, now)

    # ---------------------------------------------------------------------------- lifecycle
    def health(self) -> dict[str, Any]:
        with self.cond:
            return {
                "consumer_running": self._thread is not None and not self._stop.is_set(),
                "ledger": self.ledger,
                "recovering": self._recovery.active,
                "lag": self.lag,
                "index_entries": len(self.index),
                "index_requests": self.index.requests,
                "handed_keys": self.index.handed,
                "ended_requests": self.index.ended,
                "parked_records": self.index.parked,
                "failed_requests": self.failures.named(),
                **dict(self.index.counts),
            }

    def close(self) -> None:
        with self.cond:
            if self.closed:
                return
            self.closed = True
            self.cond.notify_all()
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=30.0)


def group_settings(settings: ConnectorSettings, error_cb: Any) -> dict[str, Any]:
    """The receiver's consumer: its replica's group, as its static member, read_committed,
    from the log start when the group has committed nothing."""
    return client_settings(
        settings.client,
        {
            "group.id": settings.group_id,
            "group.instance.id": settings.instance_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # a chunk topic created after the receiver started is found within this
            # (librdkafka's default, 5 minutes, is for topics already known)
            "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
            "error_cb": error_cb,
        },
    )


def retried(tally: Tally, topic: str, error: KafkaError) -> None:
    """A consumer error librdkafka recovers from by itself: counted and told, once per kind,
    not a failure (a topic whose metadata has not reached this client yet)."""
    text = f"{error.name()}: {error.str()}"
    if tally.error(text, "consume_errors"):
        LOGGER.warning("codeclog connector consuming %s: %s (retrying)", topic, text)
