"""`codeclog capture`: copy a topic's committed records into a capture file (Avro OCF)."""

from __future__ import annotations

import argparse
import time

from codeclog.cli.config import add_kafka_args, kafka_client_config, topics_config
from codeclog.cli.parsing import Subparsers, add_command, add_flag
from codeclog.user_files import check_replaceable

DESCRIPTION = """\
Capture codec streams from the log into an Avro object container file (deflate), one record per
Kafka record: topic, partition, offset, timestamp and its type, key, headers, the value bytes
exactly as consumed, the value's schema fingerprint and the capture wall clock. The file header
records the codeclog version and git commit, the schema fingerprints, the cluster id, the topic,
its partition count, the isolation level and the [start, end) offsets per partition.

The capture reads with a read_committed consumer and assign(): it joins no consumer group and
commits nothing. It stops at the end offsets (last stable offsets) seen when it starts, so it
always terminates; aborted transactions are absent and offsets are kept as observed (gaps where
commit markers were). Each consumed batch is flushed as one file block: a capture that crashes
is readable up to its last block.
"""

EPILOG = """\
bounds (--from, --until; --until is exclusive):
  1234                   an offset (the same on every captured partition)
  1767225600000ms        Unix milliseconds: the first record at or after that timestamp
  2026-01-01T12:00:00Z   an ISO-8601 time (UTC when no zone is given)

examples:
  codeclog capture --out incident.ocf
  codeclog capture --topic codec.chunks --request r-17 --request r-18 --out two.ocf
  codeclog capture --partition 3 --from 2026-05-09T07:00:00Z --until 2026-05-09T07:05:00Z \\
      --out window.ocf
  codeclog replay incident.ocf --policy strict      # then rerun it offline
"""


def register(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "capture",
        "capture a topic's records into a replayable file",
        DESCRIPTION,
        EPILOG,
    )
    parser.add_argument("--topic", help="topic to capture (default: the codec chunks topic)")
    parser.add_argument("--out", required=True, metavar="FILE", help="capture file to write")
    parser.add_argument(
        "--request",
        action="append",
        default=[],
        metavar="ID",
        help="keep only records with this key (request id); repeatable",
    )
    parser.add_argument(
        "--partition", action="append", type=int, metavar="P", help="capture only P; repeatable"
    )
    parser.add_argument("--from", dest="start", metavar="BOUND", help="first record to capture")
    parser.add_argument("--until", metavar="BOUND", help="stop before this record")
    add_flag(
        parser,
        "--group-less",
        help="use a throwaway random group.id instead of 'codeclog-capture' (nothing is "
        "committed either way; the fixed name exists so cluster ACLs can allow it)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="give up when no partition advances for S seconds (default 30)",
    )
    add_kafka_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: `codeclog --help` should not pay for fastavro and the capture machinery.
    from codeclog.cli.progress import StderrProgress
    from codeclog.replay.capture import (
        DEFAULT_GROUP_ID,
        CaptureSpec,
        parse_bound,
        run_capture,
        spans_json,
        throwaway_group_id,
    )

    # before the cluster, so a mistake is told at once; a device, a pipe, a folder or a
    # read-only file is refused, never truncated or waited on
    check_replaceable(args.out, "--out file")
    topic = args.topic or topics_config(args).chunks
    spec = CaptureSpec(
        topic=topic,
        partitions=tuple(args.partition) if args.partition else None,
        start=parse_bound(args.start) if args.start else None,
        until=parse_bound(args.until) if args.until else None,
        requests=tuple(args.request),
        group_id=throwaway_group_id() if args.group_less else DEFAULT_GROUP_ID,
        idle_timeout_s=args.idle_timeout,
    )
    summary = run_capture(
        kafka_client_config(args),
        spec,
        args.out,
        clock_ms=lambda: time.time_ns() // 1_000_000,
        monotonic=time.monotonic,
        progress=StderrProgress(time.monotonic, "capture", "offsets", "records written"),
    )
    print(
        f"captured {summary.records_written} of {summary.records_read} records from {topic} "
        f"(offsets per partition {spans_json(summary.spans)}) into {args.out}"
    )
    return 0
