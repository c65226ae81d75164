"""A receiver taking its consumer group over: the ledger read before any chunk.

When a receiver's group is assigned to it (a new process, or one that replaced a dead one under
the same replica identity), it pauses the chunk partitions and reads the hand-out ledger
(omni.ledger) from the group's committed ledger offset up to the end the ledger had when the
takeover began; its group's marks tell the index (omni.index) which requests ended at a
predecessor. Then it resumes the chunk partitions. Until then no request is failed for waiting
and no ledger offset is committed.

After it, the same position serves the index's ledger gate (`sync`): a request first asked for
at time t is handed out once the ledger was read to an end learnt after t, so another
replica's mark of it (it ended there) is read before any of its records is handed out here.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

LOGGER = logging.getLogger("codeclog.omni")
ASK_TIMEOUT_S = 2.0


class Takeover:
    """Where the takeover stands (module docstring). `ledger_read` and `ledger_end` go on
    after it: the receiver's position in the ledger and the ledger's end as known here."""

    def __init__(self, chunk_topic: str, ledger_topic: str) -> None:
        self.chunk_topic = chunk_topic
        self.ledger_topic = ledger_topic
        self.active = True  # no request is failed, no ledger floor committed, until done
        self.assigned = False  # the ledger and chunk partitions are this member's
        self.paused: list[Any] = []  # the chunk partitions, until the ledger is read
        self.target: int | None = None  # the ledger's end when the takeover began
        self.ledger_read = 0  # the next ledger offset to read
        self.ledger_end = 0  # the ledger's end offset as known here
        self.synced_at = float("-inf")  # the ledger was read to the end it had then
        self._sync: tuple[float, int] | None = None  # (asked at, the ledger's end then)

    def assigned_to(self, consumer: Any, partitions: list[Any], member: str) -> None:
        """Just after `consumer.assign(partitions)`: hold the chunks while taking over."""
        if not self.active:
            return
        chunks = [tp for tp in partitions if tp.topic == self.chunk_topic]
        if not chunks:
            return
        if any(tp.topic == self.ledger_topic for tp in partitions):
            consumer.pause(chunks)
            self.paused = chunks
            self.assigned = True
            return
        LOGGER.warning("codeclog connector: %s shares its group (no ledger gate)", member)
        self.active = False
        self.synced_at = float("inf")  # the ledger is another member's: nothing to wait for

    def read(self, offset: int) -> None:
        """A ledger record at `offset` was read."""
        self.ledger_read = max(self.ledger_read, offset + 1)
        self.ledger_end = max(self.ledger_end, offset + 1)

    def advance(self, consumer: Any) -> bool:
        """True once the ledger was read to its end at the start (the chunks then resume)."""
        if not (self.active and self.assigned):
            return False
        if self.target is None:
            tp = TopicPartition(self.ledger_topic, 0)
            try:
                low, high = consumer.get_watermark_offsets(tp, timeout=ASK_TIMEOUT_S)
                (committed,) = consumer.committed([tp], timeout=ASK_TIMEOUT_S)
            except KafkaException:
                return False  # asked again on the next pass
            self.target = high
            self.ledger_read = max(self.ledger_read, committed.offset, low)
            self.ledger_end = max(self.ledger_end, high)
        if self.ledger_read < self.target:
            return False
        consumer.resume(self.paused)
        self.active = False
        return True

    def sync(self, consumer: Any, since: float | None, now: float) -> bool:
        """Move `synced_at` past `since` (the first ask of a request at the ledger gate): ask
        the ledger's end at `now`, then wait until it was read; True when it moved."""
        if since is None or self.active or self.synced_at >= since:
            return False
        if self._sync is None:
            tp = TopicPartition(self.ledger_topic, 0)
            try:
                _low, high = consumer.get_watermark_offsets(tp, timeout=ASK_TIMEOUT_S)
            except KafkaException:
                return False  # asked again on the next pass
            self._sync = (now, high)
            self.ledger_end = max(self.ledger_end, high)
        at, high = self._sync
        if self.ledger_read < high:
            return False
        self.synced_at, self._sync = at, None
        return True
