"""A chunk that lands twice across a member's restart (a producer retry) is recognised, on the
real broker, as a duplicate from the restored checkpoints: counted, not decoded again."""

from __future__ import annotations

from typing import Any

import pytest

from codeclog.consumers.member.service import VocodeConfig, VocoderService
from codeclog.kafka.reader import read_partitions
from codeclog.kafka.records import InputRecord
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk

pytestmark = [pytest.mark.kafka, pytest.mark.vocoder, pytest.mark.slow]


def _member(stack: Any, engine: Any) -> VocoderService:
    """One run of the member (instance 0) until it is idle; its stats."""
    config = VocodeConfig(group=stack.group, instance_id="0", exit_when_idle_s=1.0)
    service = VocoderService(stack.client, stack.topics, config, engine)
    service.run()
    return service


def _records(stack: Any, topic: str) -> list[InputRecord]:
    """Every committed record of a topic, partition by partition (one reader)."""
    partitions = read_partitions(stack.client, topic, list(range(stack.topics.partitions)))
    return [record for p in sorted(partitions) for record in partitions[p]]


def _an_applied_chunk(stack: Any) -> tuple[bytes | None, bytes]:
    """The raw key and value of a chunk the fold decodes as it comes (enough frames, not
    final, not the first of its epoch)."""
    for record in _records(stack, stack.topics.chunks):
        chunk = wire.decode(record.value)
        decodable = isinstance(chunk, CodecChunk) and chunk.code_flat_numel > 3
        if decodable and not chunk.last_chunk and chunk.chunk_seq > 0:
            return record.key, record.value
    raise AssertionError("no decodable chunk on the log")


def test_a_chunk_that_lands_again_across_a_restart_is_a_counted_duplicate(
    stack: Any, tiny_engine: Any
) -> None:
    stack.publish_sessions(sessions=2, seconds=2, seed=7)
    first = _member(stack, tiny_engine)
    assert first.stats["windows"] > 0 and first.stats["duplicates"] == 0
    audio = [(r.key, r.value) for r in _records(stack, stack.topics.audio)]

    stack.publish_raw([_an_applied_chunk(stack)])  # the same bytes, after the commit
    second = _member(stack, tiny_engine)  # a fresh member: fold state from the checkpoints
    assert second.stats["records"] == 1 and second.stats["duplicates"] == 1, second.stats
    assert second.stats["windows"] == 0 and second.stats["dead_letters"] == 0
    assert [(r.key, r.value) for r in _records(stack, stack.topics.audio)] == audio
