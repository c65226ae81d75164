"""Prometheus metrics of the Code2Wav consumer (optional: needs the `metrics` extra).

Without prometheus_client every metric is a no-op, so the service runs the same either way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from codeclog.consumers.stream.pipeline import StepOutput
from codeclog.schemas.records import SAMPLE_RATE_HZ


class _Noop:
    def labels(self, *args: Any, **kwargs: Any) -> _Noop:
        return self

    def inc(self, amount: float = 1.0) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, value: float) -> None:
        pass


_POWERS = (1, 2, 4, 8, 16, 32, 64, 128)  # histogram buckets for counts per call or step


@dataclasses.dataclass
class VocoderMetrics:
    records: Any
    windows: Any
    duplicates: Any
    batch_size: Any
    decode_seconds: Any
    rtf: Any
    open_streams: Any
    fold_state_bytes: Any
    fold_requests: Any
    rejections: Any
    end_to_end_seconds: Any
    transactions: Any
    recoveries: Any
    pauses: Any
    paused_partitions: Any
    domain_changes: Any
    evictions: Any
    flow_calls: Any
    hift_calls: Any
    live_windows: Any

    @classmethod
    def create(cls, port: int | None) -> VocoderMetrics:
        try:
            import prometheus_client as prom
        except ImportError:
            return cls(*(_Noop() for _ in dataclasses.fields(cls)))
        registry = prom.CollectorRegistry()
        counter, gauge = prom.Counter, prom.Gauge

        def metric(kind: Any, name: str, doc: str, *labels: str, **options: Any) -> Any:
            return kind(f"codeclog_vocoder_{name}", doc, labels, registry=registry, **options)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] | None = None) -> Any:
            options = {} if buckets is None else {"buckets": buckets}
            return metric(prom.Histogram, name, doc, **options)

        metrics = cls(
            records=metric(counter, "records", "Input records consumed"),
            windows=metric(counter, "windows", "Decode windows vocoded"),
            duplicates=metric(
                counter,
                "duplicate_chunks",
                "Redelivered chunks recognised as duplicates (the digest of an applied chunk, "
                "restored checkpoints included) and not decoded again",
            ),
            batch_size=histogram("batch_size", "Windows per decode_batch call", _POWERS[:7]),
            decode_seconds=histogram("decode_seconds", "Wall time of one decode step"),
            rtf=metric(
                gauge, "rtf", "Real-time factor of the last step (decode seconds / audio seconds)"
            ),
            open_streams=metric(gauge, "open_streams", "Requests with an open stream"),
            fold_state_bytes=metric(
                gauge,
                "fold_state_bytes",
                "Bytes the fold state of the member's partitions holds, estimated from its "
                "contents (open streams and tombstones; refreshed every few seconds)",
            ),
            fold_requests=metric(
                gauge,
                "fold_requests",
                "Requests the fold state remembers: with an open stream, or as a tombstone "
                "(refreshed every few seconds)",
            ),
            rejections=metric(counter, "rejections", "Dead-lettered inputs by reason", "reason"),
            end_to_end_seconds=histogram(
                "end_to_end_seconds",
                "From a chunk's produced_at to its audio's transaction commit",
                (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            ),
            transactions=metric(counter, "transactions", "Kafka transactions by result", "result"),
            recoveries=metric(
                counter,
                "recovered_streams",
                "Open streams rebuilt from the log after an assignment",
            ),
            pauses=metric(
                counter,
                "pauses",
                "Decode steps during which a whole next batch waited (the assignment was paused)",
            ),
            paused_partitions=metric(
                gauge,
                "paused_partitions",
                "Partitions paused now because the decoder is saturated",
            ),
            domain_changes=metric(
                counter,
                "domain_changes",
                "Open streams rebuilt in another determinism domain than their checkpoint's "
                "(their audio continues within the cross-domain bound, not bytewise)",
            ),
            evictions=metric(
                counter,
                "evicted_streams",
                "Open streams evicted by the per-partition open-stream limit, by the bound "
                "that set it (state_budget: the member's bytes budget of vocoder states; "
                "open_stream_cap: --max-open-streams)",
                "cause",
            ),
            flow_calls=histogram(
                "flow_calls_per_step",
                "Flow (conformer + CFM) calls the engine made in one decode step",
                _POWERS,
            ),
            hift_calls=histogram(
                "hift_calls_per_step", "HiFT calls the engine made in one decode step", _POWERS
            ),
            live_windows=metric(
                counter,
                "live_windows",
                "Live copies of windows (docs/listening.md) by result: written (acknowledged), "
                "failed (not delivered; listeners get the committed copy), dropped (the local "
                "queue was full)",
                "result",
            ),
        )
        if port is not None:
            prom.start_http_server(port, registry=registry)
        return metrics


def observe_step(metrics: VocoderMetrics, out: StepOutput, now_ms: int) -> None:
    """A committed step's figures: records, windows, batches, decode time, RTF, rejections and
    each window's end-to-end latency (its newest chunk's produced_at to `now_ms`)."""
    m = metrics
    m.records.inc(out.records)
    m.windows.inc(len(out.audio))
    m.duplicates.inc(out.duplicates)
    for size in out.batch_sizes:
        m.batch_size.observe(size)
    m.decode_seconds.observe(out.decode_s)
    if out.decode_calls:
        m.flow_calls.observe(out.flow_calls)
        m.hift_calls.observe(out.hift_calls)
    audio_s = sum(len(c.pcm_s16le) // 2 for c in out.audio) / SAMPLE_RATE_HZ
    if audio_s > 0:
        m.rtf.set(out.decode_s / audio_s)
    for letter in out.dead_letters:
        m.rejections.labels(reason=letter.reason).inc()
    for chunk in out.audio:
        if chunk.source_produced_at_ms > 0:
            m.end_to_end_seconds.observe(max(0, now_ms - chunk.source_produced_at_ms) / 1000)
