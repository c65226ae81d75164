"""The hand-out ledger: the requests that ended at the vllm-omni connector's receivers.

One topic per edge, `<topic>.handout`, one partition, records `HandOutMark` keyed by the
receiver's consumer group and the request id. A receiver writes a mark when a request ends at
it (omni.index: `finished`, `timed_out`, `cleanup`). Its consumer group reads the ledger with
the chunk topic and commits a ledger offset below every mark a successor may need
(`HandOutIndex.ledger_floor`), so a successor that takes over the group reads, before any chunk,
the marks of the requests it would otherwise hand out again. Marks of other groups (the other
replicas of the receiving stage) tell a receiver to drop what it read of a request that ended
elsewhere. The orchestrator writes a `HandOutMove` when it moves a request of a dead replica to
another (omni.redispatch, `write_moves`): the endings of it read before are void there.

What it costs: one mark (about 100 bytes) per request per receiving replica, and at a takeover
the ledger's records from the floor on. The ledger keeps the chunk topic's retention: the
connector creates it on first use with the chunk topic's `retention.ms` (or the broker's
default), one partition, and the replication `codeclog.kafka.topics.replication_for` gives.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from codeclog.kafka.log import client_settings
from codeclog.kafka.topics import MIN_INSYNC_REPLICAS, replication_for
from codeclog.omni.index import Ending
from codeclog.omni.sender import Sender
from codeclog.omni.settings import ConnectorSettings
from codeclog.omni.tally import Tally
from codeclog.schemas import wire
from codeclog.schemas.records import HandOutEnd, HandOutMark, HandOutMove

LOGGER = logging.getLogger("codeclog.omni")
SUFFIX = ".handout"
SEPARATOR = "\x1f"  # the unit separator, in no sane group id (as codec.progress keys)
RETENTION = "retention.ms"


def ledger_topic(topic: str) -> str:
    """The ledger of the edge whose chunks are on `topic`."""
    return topic + SUFFIX


def mark_key(group: str, request_id: str) -> bytes:
    return f"{group}{SEPARATOR}{request_id}".encode()


def encode_mark(ending: Ending, group: str, topic: str, producer_id: str, now_ms: int) -> bytes:
    """The ledger record of an ending at the receiver of `group`."""
    mark = HandOutMark(
        request_id=ending.request_id,
        consumer_group=group,
        input_topic=topic,
        input_partition=ending.partition,
        last_offset=ending.last_offset,
        reason=HandOutEnd(ending.reason),
        produced_at_ms=now_ms,
        producer_id=producer_id,
    )
    return wire.encode(mark)


def decode_mark(
    value: bytes | None, offset: int, now: float
) -> tuple[str, Ending] | HandOutMove | None:
    """(group, ending) of a ledger mark, the move itself for a `HandOutMove`, None for a
    record of another kind."""
    try:
        mark = wire.decode(value)
    except wire.DecodeError as exc:
        LOGGER.warning("codeclog connector: ledger record at offset %d skipped: %s", offset, exc)
        return None
    if isinstance(mark, HandOutMove):
        return mark
    if not isinstance(mark, HandOutMark):
        return None
    ending = Ending(
        request_id=mark.request_id,
        partition=mark.input_partition,
        last_offset=mark.last_offset,
        reason=mark.reason.value,
        at=now,
        mark_offset=offset,
    )
    return mark.consumer_group, ending


@dataclasses.dataclass
class MarkWriter:
    """Writes the marks of one receiver's endings through its producer, without waiting;
    `on_marked(request, offset)` once the broker acknowledged one."""

    settings: ConnectorSettings
    sender: Sender
    tally: Tally
    on_marked: Callable[[str, int], None]

    @property
    def topic(self) -> str:
        return ledger_topic(self.settings.topic)

    def write(self, due: list[Ending]) -> list[Ending]:
        """Queue the marks of `due`; the endings to queue again (the local queue was full)."""
        now_ms = time.time_ns() // 1_000_000
        group = self.settings.group_id
        again = []
        for ending in due:
            value = encode_mark(
                ending, group, self.settings.topic, self.settings.producer_id, now_ms
            )
            rid = ending.request_id

            def delivered(err: Any, msg: Any, rid: str = rid) -> None:
                self._delivered(rid, err, msg)

            try:
                self.sender.produce(self.topic, mark_key(group, rid), value, delivered)
            except BufferError:
                again.append(ending)
            except KafkaException as exc:
                self.tally.failed("mark", rid, str(exc))
        return again

    def _delivered(self, request: str, err: Any, msg: Any) -> None:
        if err is not None:
            self.tally.failed("mark", request, f"{err.name()}: {err.str()}")
            return
        self.tally.add("marks")
        self.on_marked(request, msg.offset())


def write_moves(settings: ConnectorSettings, requests: Sequence[str], from_group: str) -> int:
    """Write a `HandOutMove` of each request (the orchestrator moved it away from the replica
    of `from_group`) and wait for the broker: how many it acknowledged."""
    tally = Tally()
    sender = Sender(settings, tally)
    topic, now_ms = ledger_topic(settings.topic), time.time_ns() // 1_000_000
    acknowledged: list[bool] = []
    for rid in requests:
        move = HandOutMove(rid, from_group, settings.topic, now_ms, settings.producer_id)
        sender.produce(
            topic,
            mark_key(from_group, rid),
            wire.encode(move),
            lambda err, _msg: acknowledged.append(err is None),
        )
    sender.close()
    return sum(acknowledged)


def ensure_ledger(client: Mapping[str, Any], topic: str, timeout_s: float = 15.0) -> str:
    """Create the ledger of `topic` when it is missing; its name. Raises KafkaException when
    the cluster cannot be asked or refuses (the caller retries)."""
    admin = AdminClient(client_settings(client))
    name = ledger_topic(topic)
    metadata = admin.list_topics(timeout=timeout_s)
    if name in metadata.topics:
        return name
    replication, min_isr = replication_for(len(metadata.brokers))
    config = {MIN_INSYNC_REPLICAS: str(min_isr), "cleanup.policy": "delete"}
    retention = _retention_of(admin, topic, timeout_s) if topic in metadata.topics else None
    if retention is not None:
        config[RETENTION] = retention
    future = admin.create_topics([NewTopic(name, 1, replication, config=config)])[name]
    try:
        future.result(timeout_s)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    LOGGER.info("codeclog connector: created the hand-out ledger %s", name)
    return name


def _retention_of(admin: AdminClient, topic: str, timeout_s: float) -> str | None:
    """The chunk topic's retention.ms when it sets one itself (not the broker's default)."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        entries = admin.describe_configs([resource])[resource].result(timeout_s)
    except KafkaException:
        return None
    entry = entries.get(RETENTION)
    if entry is None or entry.is_default:
        return None
    return str(entry.value)
