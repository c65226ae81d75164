"""The progress topic: what each transaction writes there (a StreamCheckpoint per touched request),
and how a member reads it back. Reasons: docs/operating.md, "How recovery works"."""

from __future__ import annotations

import json
import logging
from typing import TypeAlias

from codeclog.consumers.stream.fold.state import export_request
from codeclog.consumers.stream.pipeline import AudioPipeline, StepOutput
from codeclog.kafka.reader import read_partitions
from codeclog.schemas import wire
from codeclog.schemas.records import StreamCheckpoint

# One progress partition's newest checkpoint per request id
Checkpoints: TypeAlias = dict[str, StreamCheckpoint]

log = logging.getLogger("codeclog.vocode")


def progress_key(group: str, request_id: str) -> str:
    """The key of a checkpoint on the compacted progress topic: the group, U+001F (the unit
    separator, in no sane group id) and the request id, so groups never compact away each
    other's checkpoints. (v1 checkpoints were keyed by the request id alone.)"""
    return f"{group}\x1f{request_id}"


class CheckpointBuilder:
    """Builds the checkpoints of one step; remembers where each open stream's epoch began."""

    def __init__(self, input_topic: str, group: str, producer_id: str) -> None:
        self.input_topic = input_topic
        self.group = group
        self.producer_id = producer_id
        self.epoch_start: dict[str, int] = {}  # request id -> input offset of its epoch

    def reset(self, epoch_starts: dict[str, int] | None = None) -> None:
        """After a rebuild: only what recovery restored is known."""
        self.epoch_start = dict(epoch_starts or {})

    def note_epoch_starts(self, out: StepOutput) -> None:
        self.epoch_start.update(out.epoch_starts)

    def checkpoints(
        self,
        pipeline: AudioPipeline,
        out: StepOutput,
        now_ms: int,
    ) -> list[tuple[StreamCheckpoint, int]]:
        """(checkpoint, progress partition) for every request the step touched: the ones it
        folded records of, and the streams it evicted (their closing checkpoints)."""
        result = []
        for rid, partition in out.touched.items():
            if not rid:
                continue
            checkpoint = self._checkpoint(
                pipeline, rid, partition, out.last_offsets.get(rid, -1), now_ms
            )
            result.append((checkpoint, partition))
        return result

    def _checkpoint(
        self, pipeline: AudioPipeline, rid: str, partition: int, last_offset: int, now_ms: int
    ) -> StreamCheckpoint:
        exported = export_request(pipeline.fold_state(partition), rid)
        is_open = bool(exported and exported["open"])
        if not is_open:
            self.epoch_start.pop(rid, None)
        return StreamCheckpoint(
            request_id=rid,
            input_topic=self.input_topic,
            input_partition=partition,
            open=is_open,
            cache_epoch=int(exported["epoch"]) if exported else -1,
            epoch_start_offset=self.epoch_start.get(rid, -1) if is_open else -1,
            last_offset=last_offset,
            windows_emitted=pipeline.windows_emitted(rid),
            samples_emitted=pipeline.samples_emitted(rid),
            fold_state_json=json.dumps(exported, sort_keys=True) if exported else "",
            updated_at_ms=now_ms,
            producer_id=self.producer_id,
            consumer_group=self.group,
            determinism_domain=pipeline.domain,
        )


def belongs_to(checkpoint: StreamCheckpoint, group: str) -> bool:
    """Whether a checkpoint counts for `group`: a v2 one names its group; a v1 one (no group:
    every group shared them) counts only when one of this group's members wrote it (producer
    id `<group>-<instance>`)."""
    written_by = checkpoint.consumer_group
    return written_by == group or (
        not written_by and checkpoint.producer_id.startswith(f"{group}-")
    )


def read_checkpoints(
    client_config: dict[str, str],
    progress_topic: str,
    group: str,
    partitions: list[int],
    timeout_s: float,
) -> dict[int, Checkpoints]:
    """This group's newest checkpoint per request (`belongs_to`), per progress partition."""
    if not partitions:
        return {}
    by_partition = read_partitions(client_config, progress_topic, partitions, timeout_s)
    result: dict[int, Checkpoints] = {}
    for partition, records in by_partition.items():
        latest = result.setdefault(partition, {})
        for record in records:
            if not record.value:
                continue
            try:
                checkpoint = wire.decode(record.value)
            except wire.DecodeError as exc:
                log.warning("progress record at %s: %s", record.position, exc)
                continue
            if not isinstance(checkpoint, StreamCheckpoint):
                continue
            if belongs_to(checkpoint, group):
                latest[checkpoint.request_id] = checkpoint
    return result
