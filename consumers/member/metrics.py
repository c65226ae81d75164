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


@dataclasses.dataclass
class VocoderMetrics:
    records: Any
    windows: Any
    duplicates: Any
    batch_size: Any
    decode_seconds: Any
    rtf: Any
    open_streams: Any
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

    @classmethod
    def create(cls, port: int | None) -> VocoderMetrics:
        try:
            import prometheus_client as prom
        except ImportError:
            return cls(*(_Noop() for _ in dataclasses.fields(cls)))
        registry = prom.CollectorRegistry()
        metrics = cls(
            records=prom.Counter(
                "codeclog_vocoder_records", "Input records consumed", registry=registry
            ),
            windows=prom.Counter(
                "codeclog_vocoder_windows", "Decode windows vocoded", registry=registry
            ),
            duplicates=prom.Counter(
                "codeclog_vocoder_duplicate_chunks",
                "Redelivered chunks recognised as duplicates (the digest of an applied chunk, "
                "restored checkpoints included) and not decoded again",
                registry=registry,
            ),
            batch_size=prom.Histogram(
                "codeclog_vocoder_batch_size",
                "Windows per decode_batch call",
                buckets=(1, 2, 4, 8, 16, 32, 64),
                registry=registry,
            ),
            decode_seconds=prom.Histogram(
                "codeclog_vocoder_decode_seconds", "Wall time of one decode step", registry=registry
            ),
            rtf=prom.Gauge(
                "codeclog_vocoder_rtf",
                "Real-time factor of the last step (decode seconds / audio seconds)",
                registry=registry,
            ),
            open_streams=prom.Gauge(
                "codeclog_vocoder_open_streams", "Requests with an open stream", registry=registry
            ),
            rejections=prom.Counter(
                "codeclog_vocoder_rejections",
                "Dead-lettered inputs by reason",
                ["reason"],
                registry=registry,
            ),
            end_to_end_seconds=prom.Histogram(
                "codeclog_vocoder_end_to_end_seconds",
                "From a chunk's produced_at to its audio's transaction commit",
                buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                registry=registry,
            ),
            transactions=prom.Counter(
                "codeclog_vocoder_transactions",
                "Kafka transactions by result",
                ["result"],
                registry=registry,
            ),
            recoveries=prom.Counter(
                "codeclog_vocoder_recovered_streams",
                "Open streams rebuilt from the log after an assignment",
                registry=registry,
            ),
            pauses=prom.Counter(
                "codeclog_vocoder_pauses",
                "Decode steps during which a whole next batch waited (the assignment was paused)",
                registry=registry,
            ),
            paused_partitions=prom.Gauge(
                "codeclog_vocoder_paused_partitions",
                "Partitions paused now because the decoder is saturated",
                registry=registry,
            ),
            domain_changes=prom.Counter(
                "codeclog_vocoder_domain_changes",
                "Open streams rebuilt in another determinism domain than their checkpoint's "
                "(their audio continues within the cross-domain bound, not bytewise)",
                registry=registry,
            ),
            evictions=prom.Counter(
                "codeclog_vocoder_evicted_streams",
                "Open streams evicted by the per-partition open-stream limit, by the bound "
                "that set it (state_budget: the member's bytes budget of vocoder states; "
                "open_stream_cap: --max-open-streams)",
                ["cause"],
                registry=registry,
            ),
            flow_calls=prom.Histogram(
                "codeclog_vocoder_flow_calls_per_step",
                "Flow (conformer + CFM) calls the engine made in one decode step",
                buckets=(1, 2, 4, 8, 16, 32, 64, 128),
                registry=registry,
            ),
            hift_calls=prom.Histogram(
                "codeclog_vocoder_hift_calls_per_step",
                "HiFT calls the engine made in one decode step",
                buckets=(1, 2, 4, 8, 16, 32, 64, 128),
                registry=registry,
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
    m.transactions.labels(result="committed").inc()
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
