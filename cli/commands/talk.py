"""`codeclog talk`: a seeded synthetic duplex talker publishing codec chunks to Kafka."""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from typing import Any, TextIO

from codeclog.cli.config import add_kafka_args, kafka_client_config, topics_config
from codeclog.cli.parsing import Subparsers, add_command, add_flag
from codeclog.producers.publisher import (
    ChunkPublisher,
    PublisherConfig,
    PublisherStats,
    topic_partition_count,
)
from codeclog.producers.synthetic import (
    PlayResult,
    Progress,
    SessionScript,
    SyntheticConfig,
    merged,
    play,
    scripts,
)
from codeclog.producers.talker import Talker, TalkerStats, wall_clock_ms

DESCRIPTION = """\
Play N synthetic MiniCPM-o duplex talker sessions and publish their codec chunks to the chunk
topic, exactly as the upstream async-chunk producer windows them: 25 new codec ids per record
behind 3 ids of left context, unit boundaries, short units held back, turn ends that open a new
cache epoch, barge-ins (abort + re-admission), session aborts.

Everything is derived from --seed: the same seed publishes the same streams (request ids
s<seed>-0000, s<seed>-0001, ...). With --realtime each session speaks at 25 codec frames/s, as a
live talker does; without it the steps are published as fast as the broker takes them.

The topic must exist (`codeclog topics create`). Delivery is idempotent (acks=all); a record
that cannot be delivered is counted and reported, and the exit code is then 1.
"""

EPILOG = """\
examples:
  codeclog talk --sessions 4 --seconds 20 --realtime      # 4 live sessions for 20 s
  codeclog talk --sessions 200 --seconds 60 --seed 7      # a burst, as fast as possible
  codeclog talk --sessions 2 --seconds 5 --json           # machine-readable summary on stdout

exit codes: 0 all delivered; 1 some records failed or Kafka is unreachable; 2 bad arguments.
"""


def register(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "talk",
        "publish synthetic duplex talker sessions (seeded) to the chunk topic",
        DESCRIPTION,
        EPILOG,
    )
    parser.add_argument("--sessions", type=int, default=4, help="concurrent sessions (default 4)")
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="timeline length of each session (default 20)"
    )
    parser.add_argument("--seed", type=int, default=0, help="RNG seed (default 0)")
    add_flag(parser, "--realtime", help="pace each session at 25 frames/s")
    parser.add_argument("--topic", help="topic to publish to (default: the chunk topic)")
    parser.add_argument(
        "--linger-ms", type=float, default=1.0, help="producer linger.ms (default 1)"
    )
    parser.add_argument(
        "--producer-id", help="producer id stamped on records (default: talk-<host>)"
    )
    parser.add_argument(
        "--flush-timeout-s",
        type=float,
        default=30.0,
        help="how long to wait for the last acknowledgements (default 30)",
    )
    parser.add_argument(
        "--connect-timeout-s",
        type=float,
        default=10.0,
        help="give up if the cluster does not answer within this long (default 10)",
    )
    add_flag(parser, "--json", help="print the summary as JSON")
    add_flag(parser, "--quiet", help="no progress line on stderr")
    add_kafka_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    synthetic = SyntheticConfig(sessions=args.sessions, seconds=args.seconds, seed=args.seed)
    topic = args.topic or topics_config(args).chunks
    publisher_config = PublisherConfig(
        topic=topic,
        producer_id=args.producer_id or f"talk-{socket.gethostname()}",
        linger_ms=args.linger_ms,
    )
    client_config = kafka_client_config(args)
    topic_partition_count(client_config, topic, args.connect_timeout_s)
    session_scripts = scripts(synthetic)
    publisher = ChunkPublisher(client_config, publisher_config)
    talker = Talker(publisher, producer_id=publisher_config.producer_id, native_duplex=True)
    progress = None if args.quiet else _ProgressLine(sys.stderr, publisher)
    try:
        result = play(
            merged(session_scripts),
            talker.apply,
            total_s=synthetic.seconds,
            realtime=args.realtime,
            clock=time.monotonic,
            sleep=time.sleep,
            now_ms=wall_clock_ms,
            on_progress=progress,
        )
    finally:
        report = publisher.close(args.flush_timeout_s)
        if progress is not None:
            progress.done()
    publisher.raise_if_refused()  # the authorizer refused the topic: exit 2, one line
    summary = _summary(args, topic, session_scripts, talker.stats, publisher.stats, result)
    # `undelivered`: records that did not reach the log, whatever the reason (equal to `failed`
    # once every delivery report is in); what the final flush alone left is reported apart.
    stats = publisher.stats
    summary["undelivered"] = stats.failed + stats.in_flight
    summary["unacknowledged_at_close"] = report.undelivered
    _print_summary(summary, as_json=args.json)
    _print_failures(publisher)
    return 0 if summary["failed"] == 0 else 1


class _ProgressLine:
    """One stderr line, rewritten in place."""

    def __init__(self, stream: TextIO, publisher: ChunkPublisher) -> None:
        self.stream = stream
        self.publisher = publisher
        self.shown = False

    def __call__(self, progress: Progress) -> None:
        stats = self.publisher.stats
        line = (
            f"talk: {progress.timeline_s:6.1f}/{progress.total_s:g} s  steps {progress.steps}  "
            f"records {progress.records}  acked {stats.delivered}  failed {stats.failed}"
        )
        if stats.client_errors:
            line += f"  broker errors {stats.client_errors} ({self.publisher.last_client_error})"
        self.stream.write("\r" + line[:160].ljust(80))
        self.stream.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


def _summary(
    args: argparse.Namespace,
    topic: str,
    session_scripts: list[SessionScript],
    talker: TalkerStats,
    publisher: PublisherStats,
    result: PlayResult,
) -> dict[str, Any]:
    latencies = sorted(publisher.latency_ms)
    return {
        "topic": topic,
        "seed": args.seed,
        "sessions": len(session_scripts),
        "turns": sum(script.turns for script in session_scripts),
        "barge_ins": sum(script.barge_ins for script in session_scripts),
        "aborted_sessions": sum(script.aborted for script in session_scripts),
        "steps": result.steps,
        "chunks": talker.chunks,
        "control_events": talker.control_events,
        "frames": talker.frames,
        "audio_seconds": round(talker.audio_seconds, 3),
        "dropped_frames": talker.dropped_frames,
        "published": publisher.published,
        "delivered": publisher.delivered,
        "failed": publisher.failed,
        "ack_latency_ms_p50": _percentile(latencies, 0.50),
        "ack_latency_ms_p99": _percentile(latencies, 0.99),
        "elapsed_s": round(result.elapsed_s, 3),
        "realtime": bool(args.realtime),
    }


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, int(q * len(sorted_values)))
    return round(sorted_values[index], 3)


def _print_summary(summary: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, sort_keys=True))
        return
    print(
        f"published to {summary['topic']}: {summary['sessions']} sessions, "
        f"{summary['turns']} turns ({summary['barge_ins']} barge-ins, "
        f"{summary['aborted_sessions']} aborted sessions), {summary['chunks']} chunks, "
        f"{summary['control_events']} control events, {summary['frames']} frames = "
        f"{summary['audio_seconds']:.1f} s of audio"
    )
    print(
        f"delivered {summary['delivered']}/{summary['published']}, failed {summary['failed']}, "
        f"ack latency p50 {summary['ack_latency_ms_p50']} ms / p99 "
        f"{summary['ack_latency_ms_p99']} ms, {summary['elapsed_s']} s"
    )


def _print_failures(publisher: ChunkPublisher, limit: int = 5) -> None:
    failures = publisher.failures
    if not failures:
        return
    print(f"codeclog talk: {len(failures)} records were NOT delivered, e.g.:", file=sys.stderr)
    for failure in failures[:limit]:
        position = f" epoch {failure.cache_epoch} seq {failure.chunk_seq}"
        where = position if failure.cache_epoch is not None else ""
        print(
            f"  {failure.request_id} {failure.kind}{where}: {failure.error_name} {failure.error}",
            file=sys.stderr,
        )
