"""What the member counts of its steps: the totals it ends with, and each step's metrics."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from codeclog.consumers.member.metrics import VocoderMetrics, observe_step
from codeclog.consumers.stream.pipeline import AudioPipeline, StepOutput

log = logging.getLogger("codeclog.vocode")
FOLD_GAUGES_EVERY_S = 5.0  # the fold state's size is estimated at most this often (it walks it)
STAT_NAMES = ("records", "windows", "dead_letters", "duplicates", "steps", "void_steps")


class StepTally:
    """The member's totals and the metrics of its steps."""

    def __init__(self, metrics: VocoderMetrics, clock_ms: Callable[[], int]) -> None:
        self.metrics = metrics
        self._clock_ms = clock_ms
        self.totals = dict.fromkeys(STAT_NAMES, 0)
        self._fold_gauges_at = -FOLD_GAUGES_EVERY_S  # monotonic time of their last update

    def void_step(self) -> None:
        """A step a rebalance voided: decoded, never written."""
        self.totals["void_steps"] += 1

    def queued(self, out: StepOutput, pipeline: AudioPipeline) -> None:
        """On the member's thread, once the step that made `out` is queued for its
        transaction: the pipeline's gauges (the open streams; the fold state's size and the
        requests it remembers) and its evictions."""
        self.metrics.open_streams.set(pipeline.open_streams())
        self._fold_gauges(pipeline)
        for cause, count in out.evictions.items():
            self.metrics.evictions.labels(cause=cause).inc(count)

    def _fold_gauges(self, pipeline: AudioPipeline) -> None:
        """The fold state's size and the requests it remembers, at most every
        FOLD_GAUGES_EVERY_S (the estimate walks every request it remembers)."""
        now = time.monotonic()
        if now - self._fold_gauges_at < FOLD_GAUGES_EVERY_S:
            return
        self._fold_gauges_at = now
        self.metrics.fold_state_bytes.set(pipeline.fold_state_bytes())
        self.metrics.fold_requests.set(pipeline.remembered_requests())

    def committed(self, out: StepOutput, step_s: float) -> None:
        """On the commit thread, after the step's transaction committed: the step's Prometheus
        figures (`metrics.observe_step`) and the totals (`totals`, what `codeclog vocode`
        reports when it ends)."""
        observe_step(self.metrics, out, self._clock_ms())
        for name, count in (
            ("records", out.records),
            ("windows", len(out.audio)),
            ("dead_letters", len(out.dead_letters)),
            ("duplicates", out.duplicates),
            ("steps", 1),
        ):
            self.totals[name] += count
        log.debug("step: %d records, %d windows in %.3f s", out.records, len(out.audio), step_s)
