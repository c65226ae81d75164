"""What one step writes: pure functions from the step's output to its records, so the transaction
code and the live writer only write. Reasons: docs/operating.md, "A step and its transaction"."""

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
class OutputRecord:
    """One record the member produces: in a step's transaction, or to the live topic."""

    topic: str
    key: str
    value: bytes
    partition: int | None = None  # None: the producer's partitioner (murmur2 of the key)


@dataclasses.dataclass(frozen=True, slots=True)
class AudioRecord:
    """One window as written: its key (the request id) and its encoded AudioChunk."""

    key: str
    value: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class StepWrites:
    """All one transaction carries: its records (audio, dead letters), its checkpoints, and the
    positions it consumed to (`send_offsets_to_transaction`, with the group metadata)."""

    records: Sequence[OutputRecord]
    checkpoints: Sequence[OutputRecord]
    positions: list[TopicPartition]
    group_metadata: Any

    @property
    def size(self) -> int:
        """Bytes of its values (what it holds in memory while it waits for its transaction)."""
        return sum(len(w.value) for w in (*self.records, *self.checkpoints))


def audio_records(out: StepOutput) -> list[AudioRecord]:
    """The step's windows, encoded once for both copies."""
    return [AudioRecord(c.request_id, wire.encode(c)) for c in out.audio]


def live_writes(audio: Sequence[AudioRecord], topics: TopicsConfig) -> list[OutputRecord]:
    """The live copy of the step's windows (docs/listening.md)."""
    return [OutputRecord(topics.live, a.key, a.value) for a in audio]


def step_writes(
    out: StepOutput,
    audio: Sequence[AudioRecord],
    checkpoints: Sequence[tuple[StreamCheckpoint, int]],
    topics: TopicsConfig,
    group: str,
) -> tuple[list[OutputRecord], list[OutputRecord]]:
    """(records, checkpoints) of the step that made `out` and its encoded `audio`, with its
    checkpoints (checkpoint, partition). In this order: the audio chunks (keyed by request),
    the dead letters (keyed by request, "" when the record had none), and one checkpoint per
    request the step touched (keyed by group and request, into the progress partition numbered
    like the input partition). The consumed offsets travel with them (`send_offsets`), outside
    these lists."""
    records = [OutputRecord(topics.audio, a.key, a.value) for a in audio]
    records += [
        OutputRecord(topics.dlq, d.request_id or "", wire.encode(d)) for d in out.dead_letters
    ]
    progress = [
        OutputRecord(topics.progress, progress_key(group, c.request_id), wire.encode(c), partition)
        for c, partition in checkpoints
    ]
    return records, progress


def merged(steps: Sequence[StepWrites]) -> StepWrites:
    """One transaction for steps that queued one after another: their records in order, only
    the newest checkpoint of each request (the older ones would be compacted away unread: the
    transaction is visible whole or not at all), the last step's positions and metadata (a
    rebalance waits for the queue, so they all share one assignment)."""
    if len(steps) == 1:
        return steps[0]
    newest: dict[tuple[int | None, str], OutputRecord] = {}
    for step in steps:
        for write in step.checkpoints:
            newest.pop((write.partition, write.key), None)  # keep the order of the newest
            newest[(write.partition, write.key)] = write
    last = steps[-1]
    records = [write for step in steps for write in step.records]
    return StepWrites(records, list(newest.values()), last.positions, last.group_metadata)
