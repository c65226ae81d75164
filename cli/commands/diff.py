"""`codeclog diff`: the first divergence per request between two captures or two reports."""

from __future__ import annotations

import argparse
import json
import sys

from codeclog.cli.parsing import Subparsers, add_command, add_flag
from codeclog.errors import EXIT_DIFFERENT, EXIT_OK, CodeclogError

DESCRIPTION = """\
Compare two captures (files written by `codeclog capture`) or two replay reports (the output of
`codeclog replay --json`) and print, for every request that differs, its FIRST divergence:

  captures  the request's records in log order, compared by value; shown with both positions
            (partition@offset), the stream position (cache_epoch, chunk_seq) and the decoded
            fields that differ. Offsets are positions, not content: a republished capture
            has new offsets and still compares equal.
  reports   the stage verdict (policy, events, unprocessed, stage.fatal), then per request the
            outcomes in order (outcome index, chunk_seq, the keys that differ), the status and
            the audio digests.
"""

EPILOG = """\
examples:
  codeclog diff before.ocf after.ocf
  codeclog replay x.ocf --policy strict --json > strict.json
  codeclog replay x.ocf --policy tolerant --json > tolerant.json
  codeclog diff strict.json tolerant.json

exit status: 0 identical, 1 different, 2 on an error (unreadable or mismatched inputs).
"""


def register(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "diff",
        "first divergence per request between two captures or two reports",
        DESCRIPTION,
        EPILOG,
    )
    parser.add_argument("a", metavar="A", help="capture file or --json report")
    parser.add_argument("b", metavar="B", help="capture file or --json report (same kind as A)")
    add_flag(parser, "--json", help="print the divergences as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from codeclog.replay.diff import diff_paths

    try:
        divergences = diff_paths(args.a, args.b)
    except CodeclogError as exc:
        print(f"codeclog diff: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([d.to_json() for d in divergences], sort_keys=True, indent=1))
    elif divergences:
        print(f"{len(divergences)} divergence(s) between {args.a} (A) and {args.b} (B):")
        for divergence in divergences:
            print(f"  {divergence.describe()}")
    else:
        print(f"identical: {args.a} and {args.b}")
    return EXIT_DIFFERENT if divergences else EXIT_OK
