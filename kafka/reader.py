"""Reading committed records straight from the log: no group, no commits (assign(), not
subscribe()). Recovery re-reads the progress and chunk topics with it; verify and the demo read
the audio topic with it."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from codeclog.kafka.access import refusal, refusal_of_unused, refused_kind
from codeclog.kafka.calls import (
    ClusterUnavailableError,
    InfrastructureError,
    OpenTransactionError,
)
from codeclog.kafka.log import client_settings
from codeclog.kafka.records import InputRecord, Position

log = logging.getLogger("codeclog.vocode")


def input_record(
    message: Message,
    client_config: dict[str, str] | None = None,
    doing: dict[str, str] | None = None,
) -> InputRecord | None:
    """A consumed message as the pipeline's InputRecord; None for an end-of-partition event or
    a non-fatal consumer error (logged); InfrastructureError for a fatal one; KafkaAccessError
    (exit 2, never a dead letter) when the authorizer refused a resource this reader needs
    (`doing`: refusal kind -> what the reader was doing)."""
    error = message.error()
    if error is not None:
        if error.code() == KafkaError._PARTITION_EOF:
            return None
        if refusal_of_unused(error, doing or {}):  # nothing for the user to fix
            log.debug("skipped a refusal of a resource this reader does not use: %s", error)
            return None
        refused = refusal(error, client_config, doing or {})
        if refused is not None and refused_kind(error) in (doing or {}):
            raise refused
        if error.fatal():
            raise InfrastructureError(f"consumer error: {error.name()}: {error.str()}")
        log.warning("consumer error: %s", error)
        return None
    _, timestamp_ms = message.timestamp()
    position = Position(
        message.topic() or "", message.partition() or 0, message.offset() or 0, timestamp_ms
    )
    return InputRecord(position, message.key(), message.value() or b"")


def read_partition(
    client_config: dict[str, str],
    topic: str,
    partition: int,
    start: int,
    end: int | None,
    timeout_s: float = 30.0,
) -> list[InputRecord]:
    """Every committed record of one partition from `start` up to `end` (exclusive), or up to
    the partition's end (the last stable offset: read_committed) when `end` is None."""
    if end is not None and end <= start:
        return []
    consumer = Consumer(_reader_config(client_config))
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        tp = TopicPartition(topic, partition)
        return _read_until(consumer, tp, end, timeout_s, client_config)
    finally:
        consumer.close()


def read_partitions(
    client_config: dict[str, str], topic: str, partitions: list[int], timeout_s: float = 10.0
) -> dict[int, list[InputRecord]]:
    """Every committed record of several partitions of `topic`, with one reader
    (`read_partition` for each would pay a client start-up per partition), up to each
    partition's high watermark as it was when the read began: the read ends only once every
    transaction written there before it is decided. A read_committed reader stops at the last
    stable offset, the first record of a transaction still open: a member that lost its
    partitions mid-transaction leaves one open until it is aborted, and everything committed
    after it (the new owner's checkpoints) would be silently missing. Gives up
    (ClusterUnavailableError) when nothing arrives for `timeout_s`, however long the read; the
    message says when an open transaction is what it waits for."""
    result: dict[int, list[InputRecord]] = {p: [] for p in partitions}
    if not partitions:
        return result
    consumer = Consumer(_reader_config(client_config))
    try:
        ends = _high_watermarks(client_config, topic, partitions, timeout_s)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        waiting = {p for p in partitions if ends[p] > 0}
        deadline = time.monotonic() + timeout_s
        while waiting:
            if time.monotonic() > deadline:
                raise OpenTransactionError(_not_read(consumer, topic, waiting, ends))
            messages = consumer.consume(500, 0.2)
            for message in messages:
                if message.error() is None:
                    deadline = time.monotonic() + timeout_s
                record = input_record(message, client_config, {"topic": f"READ topic {topic}"})
                if record is not None:
                    result[record.position.partition].append(record)
            waiting -= {p for p in waiting if _position(consumer, topic, p) >= ends[p]}
    finally:
        consumer.close()
    return result


def _high_watermarks(
    client_config: dict[str, str], topic: str, partitions: list[int], timeout_s: float
) -> dict[int, int]:
    """Each partition's high watermark (undecided transactions included: a read_committed
    client would answer its last stable offset instead)."""
    consumer = Consumer({**_reader_config(client_config), "isolation.level": "read_uncommitted"})
    try:
        return {
            p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout_s)[1])
            for p in partitions
        }
    except KafkaException as exc:
        raise ClusterUnavailableError(
            f"cannot read the end of {topic} partitions {sorted(partitions)}: "
            f"{exc.args[0] if exc.args else exc}"
        ) from exc
    finally:
        consumer.close()


def _position(consumer: Consumer, topic: str, partition: int) -> int:
    return int(consumer.position([TopicPartition(topic, partition)])[0].offset)


def _not_read(consumer: Consumer, topic: str, waiting: set[int], ends: dict[int, int]) -> str:
    where = ", ".join(
        f"{topic}[{p}] at {_position(consumer, topic, p)} of {ends[p]}" for p in sorted(waiting)
    )
    return (
        f"timed out reading {where}: nothing arrived (a transaction still open there holds a "
        "read_committed reader, until it is committed or aborted)"
    )


def _reader_config(client_config: dict[str, str]) -> dict[str, Any]:
    return client_settings(
        client_config,
        {
            "group.id": "codeclog-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        },
    )


def _read_until(
    consumer: Consumer,
    tp: TopicPartition,
    end: int | None,
    timeout_s: float,
    client_config: dict[str, str] | None = None,
) -> list[InputRecord]:
    records: list[InputRecord] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for message in consumer.consume(500, 0.2):
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                if end is None:
                    return records
                continue
            doing = {"topic": f"READ topic {tp.topic}"}
            record = input_record(message, client_config, doing)
            if record is not None and (end is None or record.position.offset < end):
                records.append(record)
        if end is not None and consumer.position([tp])[0].offset >= end:
            return records
    raise ClusterUnavailableError(
        f"timed out reading {tp.topic}[{tp.partition}] up to offset {end}"
    )
