"""Recovery: the state of newly assigned partitions, rebuilt from the log (docs/operating.md,
"How recovery works")."""

from __future__ import annotations

import dataclasses
import json
import logging
import time

from confluent_kafka import TopicPartition

from codeclog.consumers.member.metrics import VocoderMetrics
from codeclog.consumers.member.progress import Checkpoints, read_checkpoints
from codeclog.consumers.stream.engine import check_checkpoint_fits
from codeclog.consumers.stream.fold.state import FoldState, import_request
from codeclog.consumers.stream.pipeline import AudioPipeline
from codeclog.kafka.reader import read_partition
from codeclog.kafka.records import InputRecord

log = logging.getLogger("codeclog.vocode")


@dataclasses.dataclass(frozen=True)
class RecoverySource:
    """Where recovery reads: the cluster, the topics and whose checkpoints count."""

    client_config: dict[str, str]
    chunks_topic: str
    progress_topic: str
    group: str
    timeout_s: float
    rebuild_batch: int = 256


def restore_folds(fold_state: FoldState, checkpoints: Checkpoints) -> dict[str, int]:
    """Import every request's checkpointed fold state; returns where each open stream's epoch
    began. Imported in the order of each request's newest input offset, the open streams are
    least recently active first again, as in the member that wrote them, so the open-stream
    cap (rule C1a) evicts what it would have evicted there."""
    open_starts: dict[str, int] = {}
    for rid, checkpoint in sorted(checkpoints.items(), key=lambda item: item[1].last_offset):
        if checkpoint.fold_state_json:
            import_request(fold_state, rid, json.loads(checkpoint.fold_state_json))
        if checkpoint.open and checkpoint.epoch_start_offset >= 0:
            open_starts[rid] = checkpoint.epoch_start_offset
    return open_starts


class Recovery:
    """Restores assigned partitions into a pipeline. Returns, for the open streams it rebuilt,
    the input offset where each one's epoch began (the next checkpoints need it)."""

    def __init__(self, source: RecoverySource, metrics: VocoderMetrics) -> None:
        self.source = source
        self.metrics = metrics

    def restore(self, pipeline: AudioPipeline, committed: list[TopicPartition]) -> dict[str, int]:
        """Restore the state of assigned partitions: one read of their progress partitions
        (a reader per partition cost ~0.6 s each), then each partition's open streams."""
        started = time.monotonic()
        ours = [tp.partition for tp in committed if tp.offset >= 0]
        fresh = sorted(tp.partition for tp in committed if tp.offset < 0)
        if fresh:  # this group never committed there: nothing of ours to restore
            log.info(
                "partitions %s: no checkpoint (group %s has committed nothing there): "
                "starting at the log start",
                fresh,
                self.source.group,
            )
        source = self.source
        checkpoints = read_checkpoints(
            source.client_config, source.progress_topic, source.group, ours, source.timeout_s
        )
        epoch_starts: dict[str, int] = {}
        for tp in committed:
            if tp.offset >= 0:
                epoch_starts.update(
                    self._partition(pipeline, tp, checkpoints.get(tp.partition, {}))
                )
        log.info(
            "partitions %s assigned: state restored in %.2f s",
            sorted(tp.partition for tp in committed),
            time.monotonic() - started,
        )
        return epoch_starts

    def _partition(
        self, pipeline: AudioPipeline, tp: TopicPartition, checkpoints: Checkpoints
    ) -> dict[str, int]:
        """One partition with a committed offset: restore its requests' fold states, rebuild
        the vocoder states of its open streams."""
        open_starts = restore_folds(pipeline.fold_state(tp.partition), checkpoints)
        if open_starts and tp.offset >= 0:
            self._rebuild(pipeline, tp, open_starts, checkpoints)
        log.info(
            "partition %d: restored %d requests, rebuilt %d open streams up to offset %d",
            tp.partition,
            len(checkpoints),
            len(open_starts),
            tp.offset,
        )
        return open_starts

    def _rebuild(
        self,
        pipeline: AudioPipeline,
        tp: TopicPartition,
        open_starts: dict[str, int],
        checkpoints: Checkpoints,
    ) -> None:
        """Decode the open streams' epochs without emitting, on a scratch pipeline, then hand
        their vocoder states to `pipeline`. A stream checkpointed by an engine of the other HiFT
        variant raises EngineMismatchError before anything is decoded."""
        for rid in open_starts:
            check_checkpoint_fits(rid, checkpoints[rid].determinism_domain, pipeline.domain)
        # No cap while rebuilding: it restores only streams that were open together (C1a held)
        uncapped = dataclasses.replace(pipeline.config.fold, max_open_streams=None)
        scratch = AudioPipeline(
            dataclasses.replace(pipeline.config, fold=uncapped, per_partition=True),
            pipeline.engine,
        )
        wanted = {rid.encode(): start for rid, start in open_starts.items()}
        batch: list[InputRecord] = []
        for record in read_partition(
            self.source.client_config,
            self.source.chunks_topic,
            tp.partition,
            min(open_starts.values()),
            tp.offset,
        ):
            begin = wanted.get(record.key or b"")
            if begin is not None and record.position.offset >= begin:
                batch.append(record)
            if len(batch) >= self.source.rebuild_batch:
                scratch.step(batch, emit=False)
                batch = []
        if batch:
            scratch.step(batch, emit=False)
        self.check_domains(pipeline.domain, list(open_starts), checkpoints)
        for rid in open_starts:
            rebuilt = scratch.windows_emitted(rid)
            expected = checkpoints[rid].windows_emitted
            if rebuilt != expected:
                log.warning(
                    "request %s: rebuilt %d windows, checkpoint says %d", rid, rebuilt, expected
                )
        pipeline.adopt_streams(scratch, list(open_starts), tp.partition)
        self.metrics.recoveries.inc(len(open_starts))

    def check_domains(self, domain: str, rids: list[str], checkpoints: Checkpoints) -> None:
        """A stream rebuilt in another determinism domain than the one that decoded it so far
        continues with audio that differs from an uninterrupted run in the low bits: said in
        the log and counted (docs/operating.md, "How recovery works"). Portable members never
        differ."""
        for rid in rids:
            written = checkpoints[rid].determinism_domain
            if written and written != domain:
                log.warning(
                    "request %s: checkpoint domain %s, rebuilding in domain %s: the audio "
                    "continues within the cross-domain bound, not bytewise",
                    rid,
                    written,
                    domain,
                )
                self.metrics.domain_changes.inc()
