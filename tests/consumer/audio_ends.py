"""The audio topic's ends, for the tests that catch a transaction while it is open, and the
windows a topic holds."""

from __future__ import annotations

from typing import Any

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec


def audio_ends(stack: Any, admin: AdminClient) -> tuple[dict[int, int], dict[int, int]]:
    """Per audio partition of the stack: (last stable offset, high watermark)."""
    tps = [TopicPartition(stack.topics.audio, p) for p in range(stack.topics.partitions)]

    def ends(level: IsolationLevel) -> dict[int, int]:
        futures = admin.list_offsets(
            {tp: OffsetSpec.latest() for tp in tps}, isolation_level=level, request_timeout=10
        )
        return {tp.partition: future.result().offset for tp, future in futures.items()}

    # high first: a stable offset read later and still below it is an open transaction then
    # (the other order sees records that arrived in between as open)
    high = ends(IsolationLevel.READ_UNCOMMITTED)
    return ends(IsolationLevel.READ_COMMITTED), high


def windows_on(stack: Any, topic: str) -> set[tuple[str, int, int]]:
    """(request, epoch, window index) of every window on `topic` now (committed records: on the
    live topic, every record). Each partition is read to its last stable offset
    (`read_partition`), so a transaction held open (a frozen member's) ends the read there;
    `read_partitions` would wait for it to be decided, as recovery must."""
    from codeclog.kafka.reader import read_partition
    from codeclog.schemas import wire
    from codeclog.schemas.records import AudioChunk

    found = set()
    for partition in range(stack.topics.partitions):
        for record in read_partition(stack.client, topic, partition, 0, None, 30):
            chunk = wire.decode(record.value)
            if isinstance(chunk, AudioChunk):
                found.add((chunk.request_id, chunk.cache_epoch, chunk.window_index))
    return found
