"""`codeclog listen`: follow the audio topic and play each request's audio as it arrives."""

from __future__ import annotations

import argparse
import sys
import threading
import time
import wave
from pathlib import Path
from typing import IO, Any

from codeclog.cli.config import add_kafka_args, kafka_client_config, topics_config
from codeclog.cli.parsing import Subparsers, add_command, add_flag
from codeclog.cli.stop_signals import install_stop_handlers
from codeclog.user_files import make_folder

EPILOG = """\
Isolation: committed reads the audio topic (read_committed): a window once its step's
transaction committed. Speculative (the default) also reads the live topic, where the consumer
writes each window as soon as it is decoded, before its transaction: the first copy of each
(request, epoch, window index) is played, and the committed copy that follows confirms it (or is
played itself if the live one never came). Later copies are compared and counted, never played
twice. Decoding is deterministic, so every copy of a window has the same bytes within a
determinism domain (docs/listening.md has the exact guarantee and its limits).

Start: each request from the start of its current epoch (the newest on the log when the
listener starts), then every later epoch; --from-beginning plays every epoch on the log.

Output: --out DIR writes DIR/<request>.e<epoch>.wav (24 kHz mono s16le), growing as audio
arrives, with silence where windows never arrived; --stdout writes the raw s16le PCM of every
window in arrival order (use one --request). A progress line goes to stderr; at the end, one
line per stream (on stdout; on stderr with --stdout): windows, seconds, first-audio latency
(arrival of window 0 - produced_at of its newest codec chunk), gaps (windows never received),
windows confirmed by their committed copy, and other later copies (identical / different).

Exit codes: 0 stopped (idle with --exit-when-idle, every --request ended with --until-final,
or SIGINT or SIGTERM: the open streams are ended and their files closed first); 1 the topic
cannot be read, or a later copy differed (a mismatch); 2 usage or configuration error.

Examples:
  codeclog listen --out listened/ --exit-when-idle 5
  codeclog listen --request s7-0001 --stdout --until-final | aplay -r 24000 -f S16_LE
  codeclog listen --isolation committed --out listened/
"""


def register(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "listen",
        "follow the audio topic: each request's audio in order, exactly once",
        "A listener client of the audio topic: assembles each request's PCM in "
        "window order, de-duplicates, and writes WAV files or raw PCM as audio arrives.",
        EPILOG,
    )
    add_kafka_args(parser)
    parser.add_argument(
        "--request", action="append", default=[], metavar="ID", help="only this request"
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--out", type=Path, metavar="DIR", help="write one WAV per stream")
    add_flag(output, "--stdout", help="raw s16le PCM on stdout")
    parser.add_argument("--isolation", choices=("committed", "speculative"), default="speculative")
    add_flag(parser, "--from-beginning", help="every epoch on the log")
    parser.add_argument(
        "--exit-when-idle",
        type=float,
        metavar="S",
        help="stop once caught up and nothing arrived for S seconds",
    )
    add_flag(parser, "--until-final", help="stop once the current stream of every --request ended")
    parser.set_defaults(func=run)


class Sink:
    """WAV files per (request, epoch), or raw PCM on a stream."""

    def __init__(self, out_dir: Path | None, stream: IO[bytes] | None) -> None:
        self.out_dir = out_dir
        self.stream = stream
        self.files: dict[tuple[str, int], Any] = {}

    def write(self, item: Any) -> None:
        if self.stream is not None:
            if item.pcm:
                self.stream.write(item.pcm)
                self.stream.flush()
            return
        if self.out_dir is None:
            return
        key = (item.request_id, item.cache_epoch)
        wav = self.files.get(key)
        if wav is None and item.pcm:
            path = self.out_dir / f"{_safe(item.request_id)}.e{item.cache_epoch}.wav"
            wav = wave.open(str(path), "wb")  # noqa: SIM115 (closed at the end of stream)
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(item.sample_rate_hz or 24000)
            self.files[key] = wav
        if wav is not None:
            if item.gap_samples:
                wav.writeframes(bytes(2 * item.gap_samples))
            wav.writeframes(item.pcm)
            if item.end is not None:
                wav.close()
                del self.files[key]

    def close(self) -> None:
        for wav in self.files.values():
            wav.close()
        self.files.clear()


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"


def run(args: argparse.Namespace) -> int:
    if args.until_final and not args.request:
        print("codeclog listen: --until-final needs --request", file=sys.stderr)
        return 2
    if args.out is not None:
        make_folder(args.out, "--out folder")  # before the cluster: a mistake is told at once
    client_config = kafka_client_config(args)  # errors: one line from the CLI (exit 2 or 1)
    topics = topics_config(args)
    from codeclog.consumers.readers.listener import (
        AudioListener,
        Isolation,
        ListenerError,
        StartMode,
    )

    listener = AudioListener(
        client_config,
        topics.audio,
        Isolation(args.isolation),
        requests=args.request,
        start=StartMode.BEGINNING if args.from_beginning else StartMode.CURRENT_EPOCH,
        live_topic=topics.live,
    )
    sink = Sink(args.out, sys.stdout.buffer if args.stdout else None)
    stop = threading.Event()
    install_stop_handlers(stop)
    last_audio = time.monotonic()
    shown = 0.0
    try:
        listener.start()
        while not stop.is_set():
            delivered = listener.poll(0.1)
            for item in delivered:
                sink.write(item)
            if delivered:
                last_audio = time.monotonic()
            if time.monotonic() - shown >= 1.0:
                _progress(listener)
                shown = time.monotonic()
            if args.until_final and all(listener.assembler.ended(r) for r in args.request):
                break
            idle = args.exit_when_idle
            if idle is not None and time.monotonic() - last_audio > idle and listener.caught_up():
                break
    except ListenerError as exc:
        print(f"codeclog listen: {exc}", file=sys.stderr)
        sink.close()
        return 1
    for item in listener.close():
        sink.write(item)
    sink.close()
    _progress(listener)
    print(file=sys.stderr)
    _summary(listener, sys.stderr if args.stdout else sys.stdout)  # stdout carries the PCM
    return 1 if listener.stats.mismatches else 0


def _progress(listener: Any) -> None:
    s = listener.stats
    print(
        f"\r[listen] {listener.isolation.value}: {s.delivered} windows played, "
        f"{listener.assembler.open_streams()} streams open, {s.duplicates} later copies "
        f"dropped, {s.mismatches} differed, {s.gap_windows} missing",
        end="",
        file=sys.stderr,
        flush=True,
    )


def _summary(listener: Any, out: IO[str]) -> None:
    for report in sorted(listener.assembler.reports(), key=lambda r: (r.request_id, r.cache_epoch)):
        latency = report.first_audio_latency_s
        first = "-" if latency is None else f"{latency * 1000:.0f} ms"
        print(
            f"{report.request_id} epoch {report.cache_epoch}: {report.windows} windows, "
            f"{report.samples / 24000:.2f} s, first audio {first}, gaps {report.gap_windows}, "
            f"longest wait {report.max_interval_s:.2f} s, confirmed {report.confirmed}, later "
            f"copies {report.duplicates} identical / {report.mismatches} different, "
            f"end {report.end or 'open'}",
            file=out,
        )
