"""What one step writes: a pure function from the step's output to the records of its
transaction, so the transaction code only writes (consumers/member/transaction.py).

A step's transaction carries, in this order: its audio chunks (keyed by request), its dead
letters (keyed by request, "" when the record had none), and one checkpoint per request the step
touched (keyed by group and request, into the progress partition numbered like the input
partition). The consumed offsets travel with them (`send_offsets`), outside this list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from confluent_kafka import TopicPartition

from codeclog.consumers.member.progress import progress_key
from codeclog.consumers.stream.pipeline import StepOutput
from codeclog.schemas import wire
from codeclog.schemas.records import StreamCheckpoint
from codeclog.topics_config import TopicsConfig


@dataclasses.dataclass(frozen=True, slots=True)
class Write:
    """One record of a step's transaction."""

    topic: str
    key: str
    value: bytes
    partition: int | None = None  # None: the producer's partitioner (murmur2 of the key)


@dataclasses.dataclass(frozen=True, slots=True)
class StepWrites:
    """All one step's transaction carries: its records, and the positions it consumed to
    (`send_offsets_to_transaction`, with the consumer's group metadata)."""

    records: Sequence[Write]
    positions: list[TopicPartition]
    group_metadata: Any


def step_writes(
    out: StepOutput,
    checkpoints: Sequence[tuple[StreamCheckpoint, int]],
    topics: TopicsConfig,
    group: str,
) -> list[Write]:
    """The records of the step that made `out`, with its checkpoints (checkpoint, partition)."""
    writes = [Write(topics.audio, c.request_id, wire.encode(c)) for c in out.audio]
    writes += [Write(topics.dlq, d.request_id or "", wire.encode(d)) for d in out.dead_letters]
    writes += [
        Write(topics.progress, progress_key(group, c.request_id), wire.encode(c), partition)
        for c, partition in checkpoints
    ]
    return writes
