"""`codeclog demo`: the whole mission on one machine, end to end (the README's main command)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from codeclog.cli.parsing import Subparsers, add_command, add_flag

EPILOG = """\
What it does: starts a real Kafka broker from the cached Maven jars (fetching them the first
time), creates the topics, runs N synthetic duplex sessions in real time through the talker,
runs `codeclog vocode` as a separate process (tiny vocoder on CPU by default; the checkpoint in
$CODECLOG_TOKEN2WAV_DIR when set; the GPU when torch sees one), samples consumer lag every
second, then drains, stops everything cleanly and verifies exactly-once, byte-identical audio.

Outputs (in --out): wav/<request>.wav, summary.json, latency_lag.png, vocode.log.
Exit code 0 when every chunk was delivered, the consumer exited cleanly and verify passed.
"""


def register(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "demo",
        "run the end-to-end demo on a local broker",
        "The end-to-end demo: broker, topics, live talker sessions, the Code2Wav "
        "consumer, the lag monitor, WAVs, a summary table and a plot.",
        EPILOG,
    )
    parser.add_argument("--sessions", type=int, default=6, help="concurrent sessions (default 6)")
    parser.add_argument("--seconds", type=float, default=20.0, help="session length (default 20)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("demo-out"), help="output dir")
    parser.add_argument("--bootstrap", help="use this cluster instead of a fresh local broker")
    parser.add_argument(
        "--vocoder", help="'tiny' or a checkpoint dir (default: tiny, or $CODECLOG_TOKEN2WAV_DIR)"
    )
    parser.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--partitions", type=int, default=4)
    add_flag(parser, "--no-verify", help="skip the exactly-once check")
    add_flag(
        parser,
        "--secure",
        help="run the same demo on a fresh secured local broker (SASL_SSL + SCRAM-SHA-512, "
        "ACLs): the talker, vocoder, lag monitor and readers each use their own role",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from codeclog.cli.demo import DemoOptions, run_demo

    if args.secure and args.bootstrap:
        print("codeclog demo: --secure starts its own broker; drop --bootstrap", file=sys.stderr)
        return 2
    if args.sessions < 1 or args.seconds <= 0 or args.partitions < 1:
        print(
            "codeclog demo: --sessions, --seconds and --partitions must be positive",
            file=sys.stderr,
        )
        return 2
    options = DemoOptions(
        sessions=args.sessions,
        seconds=args.seconds,
        seed=args.seed,
        out_dir=args.out,
        bootstrap=args.bootstrap,
        vocoder=args.vocoder,
        device=args.device,
        verify=not args.no_verify,
        partitions=args.partitions,
        secure=args.secure,
    )
    return run_demo(options)  # a CodeclogError: one line, exit 2 for the user's to fix (cli)
