"""The end-to-end demo: local broker, topics, live duplex sessions, the Code2Wav consumer, lag.
What it runs and writes: docs/cli.md, "The demo"."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from codeclog.devtools.members import READY_LINE, Members
from codeclog.devtools.probe import AudioProbe
from codeclog.devtools.stats import percentile
from codeclog.devtools.talker import Speech, Voice
from codeclog.kafka.log import KAFKA_LOG, client_settings
from codeclog.schemas import wire
from codeclog.schemas.records import SAMPLE_RATE_HZ, AudioChunk, DeadLetter
from codeclog.topics_config import TopicsConfig
from codeclog.user_files import make_folder

ENV_CHECKPOINT = "CODECLOG_TOKEN2WAV_DIR"
VOCODER_READY_S = 180.0
VOCODER_STOP_S = 30.0


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    sessions: int = 6
    seconds: float = 20.0
    seed: int = 7
    out_dir: Path = Path("demo-out")
    bootstrap: str | None = None  # an existing cluster instead of a fresh local broker
    vocoder: str | None = None  # default: $CODECLOG_TOKEN2WAV_DIR or "tiny"
    device: str | None = None  # default: cuda when available, else cpu
    verify: bool = True
    partitions: int = 4
    secure: bool = False  # a fresh local broker with --security scram, every part as its role


@dataclasses.dataclass(frozen=True)
class DemoCluster:
    """Where the demo runs and, per role, the client properties (and file) it uses."""

    bootstrap: str
    role_files: dict[str, Path] = dataclasses.field(default_factory=dict)  # secured only

    def config(self, role: str) -> dict[str, Any]:
        if role not in self.role_files:
            return {"bootstrap.servers": self.bootstrap}
        from codeclog.cli.config import read_properties

        return dict(read_properties(self.role_files[role]))

    def cli_args(self, role: str) -> list[str]:
        if role not in self.role_files:
            return ["--bootstrap", self.bootstrap]
        return ["--kafka-config", str(self.role_files[role])]


@dataclasses.dataclass
class Timeline:
    """What the demo observed, stamped in seconds since the demo's talker started."""

    latencies: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (t, s)
    lag: list[tuple[float, int, float, float]] = dataclasses.field(default_factory=list)
    status: list[str] = dataclasses.field(default_factory=list)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _cluster(options: DemoOptions) -> Iterator[DemoCluster]:
    if options.bootstrap:
        yield DemoCluster(options.bootstrap)
        return
    from codeclog.devtools.broker import BrokerSettings, LocalBroker

    with tempfile.TemporaryDirectory(prefix="codeclog-demo-") as tmp:
        security = "scram" if options.secure else "none"
        settings = BrokerSettings(security=security, start_timeout_s=180.0)  # busy boxes
        broker = LocalBroker(Path(tmp) / "broker", settings)
        started = time.monotonic()
        state = broker.start(progress=_say)
        _say(f"[demo] broker ready at {state.bootstrap} in {time.monotonic() - started:.1f} s")
        if state.role_configs:
            _say("[demo] SASL_SSL + SCRAM-SHA-512; each part runs as its own role")
        try:
            yield DemoCluster(state.bootstrap, {k: Path(v) for k, v in state.role_configs.items()})
        finally:
            broker.stop()
            _say("[demo] broker stopped")


def _default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def _start_vocoder(
    cluster: DemoCluster, topics_file: Path, options: DemoOptions, members: Members
) -> subprocess.Popen[bytes]:
    """`codeclog vocode` as its own process, logging into --out/vocode.log; ready once it holds
    its partitions."""
    vocoder = options.vocoder or os.environ.get(ENV_CHECKPOINT) or "tiny"
    device = options.device or _default_device()
    _say(f"[demo] starting the Code2Wav consumer: vocoder={vocoder} device={device}")
    args = ["--topics-config", str(topics_file), "--vocoder", vocoder, "--device", device]
    log = members.logs / "vocode.log"
    process = members.start("demo", *cluster.cli_args("vocoder"), *args, log=log)
    started = time.monotonic()
    members.wait_for_log(process, READY_LINE, VOCODER_READY_S)
    _say(f"[demo] consumer ready in {time.monotonic() - started:.1f} s")
    return process


class LagSampler(threading.Thread):
    """Samples the consumer group's lag once a second with the lag monitor."""

    def __init__(self, config: dict[str, Any], group: str, topic: str, t0: float) -> None:
        super().__init__(daemon=True)
        from codeclog.lag.monitor import LagMonitor

        self.monitor = LagMonitor(client_settings(config), group, topic)
        self.samples: list[tuple[float, int, float, float]] = []
        self.statuses: list[str] = []
        # the latest sample: every partition with data committed to its end (lag.drain)
        self.drained = False
        self.t0 = t0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(1.0):
            try:
                report = self.monitor.sample(int(time.time() * 1000))
            except Exception as exc:  # the demo keeps going; the sample is just missing
                self.statuses.append(f"error: {exc}")
                continue
            self.samples.append(
                (
                    time.time() - self.t0,
                    report.total_lag or 0,
                    report.max_time_lag_s or 0.0,
                    report.total_audio_lag_s or 0.0,
                )
            )
            self.statuses.append(str(report.status.value))
            self.drained = report.drained

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.monitor.close()


def _talk(
    client: dict[str, Any], topics: TopicsConfig, options: DemoOptions, show: Any
) -> dict[str, Any]:
    from codeclog.producers.publisher import PublisherConfig

    config = PublisherConfig(topic=topics.chunks, producer_id="demo-talker", linger_ms=1.0)
    voice = Voice(client, config)
    try:
        voice.speak(
            Speech(options.sessions, options.seconds, options.seed), realtime=True, on_progress=show
        )
    finally:
        report = voice.close(30)
    stats = voice.publisher.stats
    return {
        "sessions": options.sessions,
        "published": stats.delivered,
        "failed": stats.failed,
        "undelivered": report.undelivered,
        "talker_audio_seconds": round(voice.talker.stats.audio_seconds, 2),
    }


def _wait_drained(collector: AudioProbe, sampler: LagSampler, timeout_s: float) -> None:
    """Until every partition with data is committed to its end (partitions the group never
    committed on included: a total lag of 0 over the committed ones is not enough) and the
    audio collector has seen nothing new for 2 s."""
    deadline = time.monotonic() + timeout_s
    last_count, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        count = len(collector.seen)
        if count != last_count:
            last_count, stable_since = count, time.monotonic()
        elif sampler.drained and time.monotonic() - stable_since > 2.0:
            return
    _say("[demo] warning: the consumer did not drain within the timeout")


def write_wavs(chunks: list[AudioChunk], out_dir: Path) -> dict[str, float]:
    by_request: dict[str, list[AudioChunk]] = {}
    for chunk in chunks:
        by_request.setdefault(chunk.request_id, []).append(chunk)
    seconds: dict[str, float] = {}
    wav_dir = out_dir / "wav"
    wav_dir.mkdir(parents=True, exist_ok=True)
    for rid, items in sorted(by_request.items()):
        pcm = b"".join(c.pcm_s16le for c in items)
        with wave.open(str(wav_dir / f"{rid}.wav"), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(SAMPLE_RATE_HZ)
            wav.writeframes(pcm)
        seconds[rid] = len(pcm) / 2 / SAMPLE_RATE_HZ
    return seconds


def _dead_letters(client: dict[str, Any], topics: TopicsConfig) -> dict[str, int]:
    from codeclog.kafka.reader import read_partition

    reasons: dict[str, int] = {}
    for partition in range(topics.dlq_partitions):
        for record in read_partition(client, topics.dlq, partition, 0, None):
            letter = wire.decode(record.value)
            if isinstance(letter, DeadLetter):
                reasons[letter.reason] = reasons.get(letter.reason, 0) + 1
    return reasons


def plot(timeline: Timeline, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _say("[demo] matplotlib is not installed: no plot (pip install 'codeclog[plot]')")
        return False
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    if timeline.latencies:
        xs, ys = zip(*timeline.latencies, strict=True)
        top.plot(xs, [y * 1000 for y in ys], ".", markersize=3)
    top.set_ylabel("chunk latency (ms)")
    top.set_title("codeclog demo: produced_at -> audio committed")
    if timeline.lag:
        ts, records, time_lag, audio_lag = zip(*timeline.lag, strict=True)
        bottom.plot(ts, records, label="lag (records)")
        bottom.plot(ts, audio_lag, label="unvocoded audio (s)")
        bottom.plot(ts, time_lag, label="time lag (s)")
        bottom.legend(loc="upper right")
    bottom.set_xlabel("seconds since the talker started")
    bottom.set_ylabel("lag")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def run_demo(options: DemoOptions) -> int:
    from codeclog.kafka.topics import ensure_topics

    started = time.monotonic()
    KAFKA_LOG.setLevel(logging.CRITICAL)  # reconnect noise
    make_folder(options.out_dir, "--out folder")
    topics = TopicsConfig(partitions=options.partitions)
    topics_file = options.out_dir / "topics.json"
    topics_file.write_text(json.dumps({"partitions": options.partitions}))
    with _cluster(options) as cluster:
        admin = cluster.config("admin")
        ensure_topics(admin, topics)
        if cluster.role_files:
            from codeclog.kafka.acls import apply_acls, role_acls

            # The demo plots time and audio lag: its monitor may read the chunk payloads.
            apply_acls(admin, role_acls(topics, monitor_reads=True))
        members = Members(options.out_dir)
        vocoder = _start_vocoder(cluster, topics_file, options, members)
        t0 = time.time()
        collector = AudioProbe(cluster.config("replay"), topics.audio, topics.partitions)
        sampler = LagSampler(cluster.config("monitor"), "codeclog-vocoder", topics.chunks, t0)
        collector.start()
        sampler.start()
        show = _progress_printer(collector, sampler, vocoder)
        talk = _talk(cluster.config("talker"), topics, options, show)
        print(file=sys.stderr)
        _say("[demo] talker done; waiting for the consumer to drain")
        _wait_drained(collector, sampler, timeout_s=60)
        code = members.stop(vocoder, VOCODER_STOP_S)
        collector.stop()
        sampler.stop()
        summary = _summarise(
            talk, collector, sampler, cluster.config("replay"), topics, options, code, t0
        )
        summary["secure"] = bool(cluster.role_files)
        summary.update(_capture_and_report(cluster.config("replay"), topics, options.out_dir))
        if options.verify:
            summary["verify"] = _verify(cluster.config("replay"), topics_file, options)
    summary["elapsed_s"] = round(time.monotonic() - started, 1)
    _report(summary, options.out_dir)
    healthy = code == 0 and summary.get("verify", {"ok": True})["ok"] and talk["failed"] == 0
    return 0 if healthy else 1


def _progress_printer(
    collector: AudioProbe, sampler: LagSampler, vocoder: subprocess.Popen[bytes]
) -> Any:
    def show(progress: Any) -> None:
        lag = sampler.samples[-1] if sampler.samples else (0, 0, 0.0, 0.0)
        status = sampler.statuses[-1] if sampler.statuses else "-"
        alive = "up" if vocoder.poll() is None else f"exited {vocoder.returncode}"
        line = (
            f"\r[demo] t={progress.timeline_s:5.1f}/{progress.total_s:.0f}s "
            f"chunks={progress.records:5d} audio windows={len(collector.seen):5d} "
            f"lag={lag[1]:3d} rec {lag[3]:5.2f} s audio  status={status:6s} vocoder={alive}   "
        )
        print(line, end="", file=sys.stderr, flush=True)

    return show


def _summarise(
    talk: dict[str, Any],
    collector: AudioProbe,
    sampler: LagSampler,
    reader: dict[str, Any],
    topics: TopicsConfig,
    options: DemoOptions,
    vocoder_exit: int,
    t0: float,
) -> dict[str, Any]:
    chunks = collector.chunks
    seconds = write_wavs(chunks, options.out_dir)
    timed = [(at - t0, latency) for at, latency in collector.latencies()]
    latencies = [latency for _, latency in timed]
    timeline = Timeline(timed, sampler.samples, sampler.statuses)
    plotted = plot(timeline, options.out_dir / "latency_lag.png")
    return {
        **talk,
        "requests_with_audio": len(seconds),
        "audio_seconds": round(sum(seconds.values()), 2),
        "audio_windows": len(chunks),
        "rejections": _dead_letters(reader, topics),
        "chunk_latency_ms": {
            "p50": round(percentile(latencies, 50, empty=0.0) * 1000, 1),
            "p99": round(percentile(latencies, 99, empty=0.0) * 1000, 1),
        },
        "peak_lag": {
            "records": max((s[1] for s in sampler.samples), default=0),
            "time_s": round(max((s[2] for s in sampler.samples), default=0.0), 2),
            "audio_s": round(max((s[3] for s in sampler.samples), default=0.0), 2),
        },
        "lag_statuses": sorted(set(sampler.statuses)),
        "vocoder_exit_code": vocoder_exit,
        "plot": str(options.out_dir / "latency_lag.png") if plotted else None,
        "wav_dir": str(options.out_dir / "wav"),
    }


def _capture_and_report(
    reader: dict[str, Any], topics: TopicsConfig, out_dir: Path
) -> dict[str, Any]:
    """Capture the chunk topic the demo wrote and write its HTML report beside the plot."""
    from codeclog.replay.capture import CaptureSpec, run_capture
    from codeclog.replay.report.model import ReportOptions
    from codeclog.replay.report.writer import write_report

    capture = out_dir / "chunks.ocf"
    summary = run_capture(
        reader,
        CaptureSpec(topic=topics.chunks),
        capture,
        clock_ms=lambda: time.time_ns() // 1_000_000,
        monotonic=time.monotonic,
    )
    written = write_report([capture], out_dir / "report.html", ReportOptions())
    _say(
        f"[demo] captured {summary.records_written} records into {capture}; "
        f"report {written.path} ({written.size_bytes / 1e6:.2f} MB)"
    )
    return {"capture": str(capture), "report": str(written.path)}


def _verify(reader: dict[str, Any], topics_file: Path, options: DemoOptions) -> dict[str, Any]:
    from codeclog.consumers.readers.verify import verify
    from codeclog.vocoder.engine import Code2WavEngine

    _say("[demo] verifying: offline replay of every chunk vs the audio topic")
    engine = Code2WavEngine.from_spec(
        options.vocoder or os.environ.get(ENV_CHECKPOINT) or "tiny",
        device=options.device or _default_device(),
    )
    topics = TopicsConfig.load(topics_file)
    report = verify(reader, topics, engine)
    return {
        "ok": report.ok,
        "expected_windows": report.expected_windows,
        "actual_windows": report.actual_windows,
        "missing": len(report.missing),
        "duplicated": len(report.duplicated),
        "mismatched": len(report.mismatched),
        "unexpected": len(report.unexpected),
    }


def _report(summary: dict[str, Any], out_dir: Path) -> None:
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    rejections = ", ".join(f"{k} {v}" for k, v in sorted(summary["rejections"].items())) or "none"
    rows = [
        ("sessions", summary["sessions"]),
        ("chunks published", f"{summary['published']} ({summary['failed']} failed)"),
        ("requests with audio", summary["requests_with_audio"]),
        ("audio", f"{summary['audio_seconds']} s in {summary['audio_windows']} windows"),
        ("rejections by reason", rejections),
        (
            "chunk latency p50 / p99",
            f"{summary['chunk_latency_ms']['p50']} / {summary['chunk_latency_ms']['p99']} ms",
        ),
        (
            "peak lag",
            f"{summary['peak_lag']['records']} records, {summary['peak_lag']['time_s']} s, "
            f"{summary['peak_lag']['audio_s']} s of audio",
        ),
        ("lag statuses seen", ", ".join(summary["lag_statuses"]) or "-"),
    ]
    verify = summary.get("verify")
    if verify is not None:
        verdict = "exactly once, byte-identical" if verify["ok"] else f"FAILED {verify}"
        rows.append(("verify", verdict))
    rows += [
        ("WAV files", summary["wav_dir"]),
        ("plot", summary["plot"] or "-"),
        ("capture", summary["capture"]),
        ("report", summary["report"]),
        ("elapsed", f"{summary['elapsed_s']} s"),
    ]
    width = max(len(name) for name, _ in rows)
    print("\ncodeclog demo summary")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
