"""`codeclog report`: a captured failure as one self-contained HTML page."""

from __future__ import annotations

import argparse
from pathlib import Path

from codeclog.cli.parsing import Subparsers, add_command, add_flag, add_offline_vocoder_args
from codeclog.terminal_text import printable

DESCRIPTION = """\
Replay INPUT (a capture file or a JSONL scenario, as `codeclog replay` takes) and write one
self-contained HTML file that any current browser opens offline (its script, styles, charts and
data are inlined):

  summary      requests by final status, rejections and dead letters by reason, the strict
               policy's fatal rejection with the exact upstream error JSON and the requests it
               would have killed, the capture's provenance (topic, partitions, offsets, cluster
               id, codeclog version)
  timeline     one mark per input record, one row per request, coloured by what the fold did
               (decoded, held, marker, duplicate, gap, rejected, abandoned, ...), epochs as
               bands, the strict policy's fatal point marked; zoom, hover for the record
  outcomes     every non-clean outcome with the position of its record, sortable, filterable
  audio        with --vocoder: each request's audio under the tolerant policy, player and
               waveform, and the strict policy's audio up to its fatal point where it differs

With INPUT2, both inputs are shown and the first divergence per request (what `codeclog diff`
finds: record by record for two captures, by replay report otherwise) is highlighted.
"""

EPILOG = """\
examples:
  codeclog report failure.ocf --out failure.html
  codeclog report failure.ocf --vocoder tiny --out failure.html      # with the audio
  codeclog report before.ocf after.ocf --out diff.html               # two inputs

--out is a new file or a regular file to replace (atomically; a symbolic link is followed); it is
never one of the inputs, a folder, a device or a read-only file.

exit status: 0 written; 2 an input that cannot be read, is not a capture or a scenario, holds
no record or has a corrupt block (without --skip-corrupt-blocks), or an --out that cannot or
must not be written; 1 any other failure.
"""


def register(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "report",
        "a capture or scenario as one self-contained HTML incident report",
        DESCRIPTION,
        EPILOG,
    )
    parser.add_argument("input", metavar="INPUT", help="capture file (.ocf) or JSONL scenario")
    parser.add_argument(
        "input2", metavar="INPUT2", nargs="?", help="a second input to compare with INPUT"
    )
    parser.add_argument(
        "--out", required=True, type=Path, metavar="FILE", help="the HTML file to write"
    )
    parser.add_argument(
        "--policy",
        choices=("strict", "tolerant"),
        default="tolerant",
        help="the policy of the timeline, the outcome table and the statuses (default "
        "tolerant); the strict policy's fatal rejection is shown either way",
    )
    add_offline_vocoder_args(
        parser,
        kernels_help="with --vocoder: portable (default, the same bytes on every x86-64 CPU) "
        "or native",
    )
    add_flag(
        parser,
        "--skip-corrupt-blocks",
        help="read past a capture's corrupt blocks; the page and the summary count what was "
        "skipped (default: a corrupt block is an error naming it)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: `codeclog --help` should not pay for Jinja2 and the replay machinery.
    from codeclog.consumers.stream.fold.state import Policy
    from codeclog.replay.report.model import ReportOptions
    from codeclog.replay.report.writer import write_report

    inputs = [args.input] if args.input2 is None else [args.input, args.input2]
    options = ReportOptions(
        Policy(args.policy), args.vocoder, args.kernels, args.skip_corrupt_blocks
    )
    written = write_report(inputs, args.out, options)
    notes = [_count(written.records, "record"), _count(written.requests, "request")]
    if written.skipped_blocks:
        notes.append(f"{_count(written.skipped_blocks, 'corrupt block')} skipped")
    text = f"wrote {written.path} ({written.size_bytes / 1e6:.2f} MB): {', '.join(notes)}"
    print(printable(text + (f"; {written.fatal}" if written.fatal else "")))
    return 0


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
