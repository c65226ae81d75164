"""Bad inputs and a second consumer group on the real broker (issue 16, items 2-4).

- a poison record just under the broker's max message size: its dead letter still fits (a
  bounded prefix, the size and SHA-256 of the whole), the rest proceeds, the member never loops;
- two groups on the same chunk and progress topics: each produces all of its audio;
- a record without a key: dead-lettered (`missing_key`), never vocoded.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import pytest
from confluent_kafka import Producer

from codeclog.consumers.member.service import VocodeConfig, VocoderService
from codeclog.consumers.readers.verify import actual_audio, verify
from codeclog.consumers.stream.dead_letter import DEAD_LETTER_PREFIX_BYTES
from codeclog.consumers.stream.wire_input import MISSING_KEY
from codeclog.kafka.reader import read_partition
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk, DeadLetter, StreamCheckpoint

pytestmark = [pytest.mark.kafka, pytest.mark.vocoder, pytest.mark.slow]

BROKER_MAX_BATCH = 1_048_588  # Kafka's default message.max.bytes (a record batch)
WINDOW = (4218, 4218, 4218, *range(100, 125))


def _run(stack: Any, engine: Any, topics: Any = None, group: str | None = None) -> VocoderService:
    config = VocodeConfig(group=group or stack.group, exit_when_idle_s=4.0)
    service = VocoderService(stack.client, topics or stack.topics, config, engine)
    service.run()
    return service


def _dead_letters(stack: Any, topics: Any = None) -> list[DeadLetter]:
    letters = []
    for record in read_partition(stack.client, (topics or stack.topics).dlq, 0, 0, None):
        letter = wire.decode(record.value)
        assert isinstance(letter, DeadLetter)
        letters.append(letter)
    return letters


def test_a_near_limit_poison_record_is_dead_lettered_in_bounded_form(
    stack: Any, tiny_engine: Any
) -> None:
    stack.publish_sessions(sessions=3, seconds=3, seed=21)
    body = wire.encode(CodecChunk("p-huge", WINDOW, 0, 0, 28, 25, 3))
    key = b"p-huge"
    value = body + b"\x00" * (BROKER_MAX_BATCH - 200 - len(body) - len(key))
    producer = Producer({**stack.client, "message.max.bytes": 4_000_000, "linger.ms": 0})
    producer.produce(stack.topics.chunks, key=key, value=value)
    assert producer.flush(30) == 0  # the broker takes it
    stack.publish_sessions(sessions=3, seconds=3, seed=22)

    service = _run(stack, tiny_engine)  # before the fix: rewinds forever on MSG_SIZE_TOO_LARGE

    huge = [d for d in _dead_letters(stack) if d.request_id == "p-huge"]
    assert len(huge) == 1, [d.reason for d in _dead_letters(stack)]
    letter = huge[0]
    assert letter.reason == "undecodable_record"
    assert letter.raw_value_truncated
    assert letter.raw_value == value[:DEAD_LETTER_PREFIX_BYTES]
    assert letter.raw_value_size == len(value)
    assert letter.raw_value_sha256 == hashlib.sha256(value).hexdigest()
    assert service.stats["dead_letters"] == 1
    report = verify(stack.client, stack.topics, tiny_engine)  # every good window, once
    assert report.ok, report.to_dict()
    assert report.expected_windows == service.stats["windows"] > 0


def test_a_dead_letter_fits_a_dead_letter_topic_smaller_than_the_input(
    stack: Any, tiny_engine: Any
) -> None:
    """The dead-letter topic allows 200 kB, the input 1 MiB: a 300 kB poison record is kept as
    a prefix (whole, it would abort every transaction: MSG_SIZE_TOO_LARGE, forever)."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )

    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        stack.topics.dlq,
        incremental_configs=[
            ConfigEntry("max.message.bytes", "200000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin = AdminClient(stack.client)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    body = wire.encode(CodecChunk("p-big", WINDOW, 0, 0, 28, 25, 3))
    value = body + b"\x01" * 300_000
    stack.publish_sessions(sessions=2, seconds=3, seed=26)
    producer = Producer({**stack.client, "message.max.bytes": 4_000_000})
    producer.produce(stack.topics.chunks, key=b"p-big", value=value)
    assert producer.flush(30) == 0
    service = _run(stack, tiny_engine)
    [letter] = [d for d in _dead_letters(stack) if d.request_id == "p-big"]
    assert letter.raw_value_truncated and letter.raw_value_size == len(value)
    assert len(letter.raw_value) <= DEAD_LETTER_PREFIX_BYTES
    assert service.stats["windows"] > 0
    assert verify(stack.client, stack.topics, tiny_engine).ok


def test_a_record_without_a_key_is_dead_lettered(stack: Any, tiny_engine: Any) -> None:
    stack.publish_sessions(sessions=2, seconds=3, seed=23)
    stack.publish_raw([(None, wire.encode(CodecChunk("p-nullkey", WINDOW, 0, 0, 28, 25, 3)))])
    stack.publish_sessions(sessions=2, seconds=3, seed=24)
    service = _run(stack, tiny_engine)
    letters = [d for d in _dead_letters(stack) if d.request_id == "p-nullkey"]
    assert [d.reason for d in letters] == [MISSING_KEY]
    assert letters[0].raw_key is None and not letters[0].raw_value_truncated
    windows, _ = actual_audio(stack.client, stack.topics)
    assert not [key for key in windows if key[0] == "p-nullkey"]
    assert service.stats["windows"] > 0
    assert verify(stack.client, stack.topics, tiny_engine).ok


def test_two_groups_on_the_same_topics_each_produce_all_their_audio(
    stack: Any, tiny_engine: Any, unique_name: Any
) -> None:
    """Before the fix the second group restored the first group's checkpoints: 0 windows and
    a DLQ full of stale_cache_epoch for valid records."""
    from codeclog.kafka.topics import ensure_topics

    stack.publish_sessions(sessions=3, seconds=4, seed=25)
    first = _run(stack, tiny_engine)
    assert verify(stack.client, stack.topics, tiny_engine).ok
    # A group that reprocesses the same input writes its own output topics; it shares the
    # chunk topic and the progress topic with the first group.
    fresh = dataclasses.replace(stack.topics, audio=unique_name("audio2"), dlq=unique_name("dlq2"))
    ensure_topics(stack.client, fresh)
    second = _run(stack, tiny_engine, fresh, group=unique_name("fresh-group"))
    assert second.stats["windows"] == first.stats["windows"] > 0
    assert second.stats["dead_letters"] == first.stats["dead_letters"] == 0
    report = verify(stack.client, fresh, tiny_engine)
    assert report.ok, report.to_dict()
    assert report.expected_windows == second.stats["windows"]
    # Both groups' checkpoints are on the progress topic, each naming its group.
    groups = set()
    for partition in range(stack.topics.partitions):
        for record in read_partition(stack.client, stack.topics.progress, partition, 0, None):
            checkpoint = wire.decode(record.value)
            assert isinstance(checkpoint, StreamCheckpoint)
            assert record.key == f"{checkpoint.consumer_group}\x1f{checkpoint.request_id}".encode()
            groups.add(checkpoint.consumer_group)
    assert groups == {first.config.group, second.config.group}
    # The first group restarts on its own checkpoints: nothing new, nothing redone.
    again = _run(stack, tiny_engine)
    assert again.stats["windows"] == 0
    assert verify(stack.client, stack.topics, tiny_engine).ok
