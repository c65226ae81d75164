"""`codeclog replay`: rerun a capture or a JSONL scenario offline, or republish it to a topic."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from codeclog.cli.config import (
    add_kafka_args,
    add_limit_args,
    kafka_client_config,
    limit_options,
)
from codeclog.cli.parsing import (
    Subparsers,
    add_command,
    add_flag,
    add_offline_vocoder_args,
    add_variant_args,
)
from codeclog.errors import EXIT_USAGE
from codeclog.user_files import make_folder

DESCRIPTION = """\
Rerun a captured stream offline through the same fold (and, with --vocoder, the same Code2Wav
vocoder) as the live consumer, and print the report: per request its status (open, released,
killed), decode windows, audio seconds and rejections by reason.

INPUT is a capture file written by `codeclog capture` (recognised by the Avro magic Obj\\x01) or
a JSONL scenario (one event per line, see tests/data/scenarios/README.md). Records are replayed
per partition in offset order. Time comes only from the records, so the same input and codeclog
version give a byte-identical --json report and identical audio.

--policy strict reproduces the upstream MiniCPM-o 4.5 Code2Wav: the first rejection kills the
stage. The summary then shows the error the upstream would have raised, e.g.
  MiniCPMO45Code2WavBatchError {"frames":1,"minimum":4,"reason":"chunk_below_lookahead_window"}
and the requests it would have killed. --policy tolerant (the default) is the product's fold:
a bad chunk costs at most its own request.

--to-topic T republishes the input into a live topic instead (same keys, values and headers,
order per key kept; idempotent producer, murmur2_random partitioner) and prints the counts.
--keep-timestamps reuses the captured CreateTime timestamps; a LogAppendTime topic, such as the
chunk topic `topics create` makes, stamps its own either way.
"""

EPILOG = """\
examples:
  codeclog replay incident.ocf                         # tolerant, fold only
  codeclog replay incident.ocf --policy strict         # what the upstream stage would have done
  codeclog replay incident.ocf --vocoder tiny --wav-dir out/   # audio: one WAV per request
  codeclog replay incident.ocf --vocoder tiny --hift causal     # the causal HiFT (scheme B)
  codeclog replay incident.ocf --json > a.json && codeclog diff a.json b.json
  codeclog replay incident.ocf --to-topic codec.chunks.rerun   # feed a live consumer again

exit status: 0 when the replay ran (whatever the verdict); 1 on a failure (the cluster, for
--to-topic); 2 on a usage error (options, an unreadable or invalid INPUT, a capture block that is
corrupt without --skip-corrupt-blocks, a refusal by the cluster's auth).
"""


def register(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "replay",
        "rerun a capture or scenario offline (or republish it)",
        DESCRIPTION,
        EPILOG,
    )
    parser.add_argument("input", metavar="INPUT", help="capture file (.ocf) or JSONL scenario")
    parser.add_argument(
        "--policy",
        choices=("strict", "tolerant"),
        default="tolerant",
        help="fold policy: strict mirrors the upstream, tolerant is the product (default)",
    )
    add_offline_vocoder_args(
        parser,
        kernels_help="with --vocoder: portable (default) gives the same audio bytes on every "
        "x86-64 CPU; native is torch's own kernels, faster, bytes depend on the CPU or GPU",
    )
    add_variant_args(
        parser,
        hift_help="with --vocoder: the HiFT vocoder, noncausal (default, scheme A) or causal "
        "(scheme B, minicpmo-utils 1.0.7: fixed 8-frame delay, no cross-fade); replay with "
        "the variant the live member ran to reproduce its audio",
        dtype_help="with --vocoder: the flow's precision, float32 (default) or bfloat16 "
        "(float16 is for CUDA; replay runs on the CPU). Another dtype is another determinism "
        "domain",
    )
    add_flag(parser, "--json", help="print the report as JSON")
    add_flag(
        parser,
        "--skip-corrupt-blocks",
        help="read past a capture's corrupt blocks; the report counts what was skipped "
        "(default: a corrupt block is an error naming it)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="processes for a state-only tolerant replay of a capture, whole partitions each "
        "(default: one per core, up to 4); the report is the same for any N",
    )
    parser.add_argument(
        "--wav-dir", type=Path, metavar="D", help="write one 24 kHz mono WAV per request into D"
    )
    add_limit_args(parser)
    publish = parser.add_argument_group("republish")
    publish.add_argument("--to-topic", metavar="T", help="republish INPUT into topic T instead")
    add_flag(
        publish,
        "--keep-timestamps",
        help="with --to-topic: keep the captured CreateTime timestamps (default: new ones)",
    )
    add_kafka_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Errors: exit 2 for options, an unreadable or invalid INPUT, a refusal (codeclog.cli)."""
    _check_args(args)
    if args.to_topic:
        return _republish(args)
    return _replay(args)


def _check_args(args: argparse.Namespace) -> None:
    from codeclog.replay.errors import ReplayOptionError

    if args.wav_dir is not None and args.vocoder == "none":
        raise ReplayOptionError("--wav-dir needs audio: add --vocoder tiny or --vocoder DIR")
    if args.vocoder == "none" and (args.hift != "noncausal" or args.dtype != "float32"):
        raise ReplayOptionError("--hift and --dtype choose the vocoder: add --vocoder tiny or DIR")
    if args.to_topic and (args.wav_dir is not None or args.vocoder != "none" or args.json):
        raise ReplayOptionError("--to-topic republishes only: drop --vocoder, --wav-dir and --json")


def _replay(args: argparse.Namespace) -> int:
    from codeclog.cli.progress import StderrProgress
    from codeclog.consumers.stream.fold.state import Policy
    from codeclog.replay.inputs import load_input
    from codeclog.replay.runner import ReplayOptions, replay, report_json
    from codeclog.replay.summary import format_summary
    from codeclog.replay.wav import write_wavs

    if args.workers is not None and args.workers < 1:
        print("codeclog replay: --workers must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    if args.dtype == "float16":
        print(
            "codeclog replay: --dtype float16: half precision is for CUDA; replay runs on the "
            "CPU (use float32 or bfloat16)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.wav_dir is not None:
        make_folder(args.wav_dir, "--wav-dir folder")  # before the replay, not after it
    source = load_input(args.input, args.skip_corrupt_blocks)
    options = ReplayOptions(
        Policy(args.policy),
        args.vocoder,
        keep_pcm=args.wav_dir is not None,
        workers=args.workers,
        kernels=args.kernels,
        hift=args.hift,
        dtype=args.dtype,
        limits=limit_options(args),
    )
    progress = StderrProgress(time.monotonic, "replay", "records")
    result = replay(source, options, progress)
    if args.wav_dir is not None:
        written = write_wavs(args.wav_dir, result.pcm_by_request)
        print(f"wrote {len(written)} WAV file(s) into {args.wav_dir}", file=sys.stderr)
    sys.stdout.write(report_json(result.report) if args.json else format_summary(result.report))
    return 0


def _republish(args: argparse.Namespace) -> int:
    from codeclog.replay.inputs import load_input
    from codeclog.replay.republish import run_republish, scenario_records

    source = load_input(args.input, args.skip_corrupt_blocks)
    records: Any = source.records if source.metadata is not None else scenario_records(source)
    summary = run_republish(
        kafka_client_config(args), args.to_topic, records, keep_timestamps=args.keep_timestamps
    )
    print(
        f"republished {summary.produced} records ({summary.keys} keys) to {args.to_topic}: "
        f"{summary.delivered} delivered, {summary.failed} failed"
        + (f" (first error: {summary.first_error})" if summary.failed else "")
    )
    return 0 if summary.failed == 0 else 1
