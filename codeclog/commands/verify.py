"""`codeclog verify`: every decode window exactly once on the audio topic, byte-identical."""

from __future__ import annotations

import argparse
import json
import sys

from codeclog.config import ConfigError, add_kafka_args, kafka_client_config, topics_config
from consumers.fold.machine import Policy

EPILOG = """\
Exit codes: 0 every window of the offline replay appears exactly once on the audio topic with
the same SHA-256; 1 something is missing, duplicated, unexpected or different; 2 usage error.

It replays the whole chunk topic offline (same fold, same vocoder) and reads the audio topic
with read_committed, so run it when the consumer is idle (after `codeclog vocode
--exit-when-idle`, or on a quiet stack).
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check the audio topic against an offline replay of the chunk topic",
        description="An operator's oracle: replays the chunk topic offline and checks that "
        "every decode window appears exactly once on the audio topic and that each request's "
        "audio is byte-identical to the replay.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_kafka_args(parser)
    parser.add_argument("--vocoder", default="tiny", help="'tiny' or a checkpoint dir")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--policy", choices=[p.value for p in Policy], default=Policy.TOLERANT.value
    )
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        client_config = kafka_client_config(args)
        topics = topics_config(args)
    except ConfigError as exc:
        print(f"codeclog verify: {exc}", file=sys.stderr)
        return 2
    from consumers.verify import verify
    from vocoder.engine import Code2WavEngine

    engine = Code2WavEngine.from_spec(args.vocoder, device=args.device)

    def progress(line: str) -> None:
        print(line, file=sys.stderr)

    report = verify(client_config, topics, engine, Policy(args.policy), progress)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1, sort_keys=True))
    else:
        print(
            f"requests {report.requests}, windows expected {report.expected_windows}, "
            f"on the audio topic {report.actual_windows}"
        )
        for name in ("missing", "duplicated", "unexpected", "mismatched"):
            keys = getattr(report, name)
            print(f"  {name}: {len(keys)}" + (f" e.g. {keys[:3]}" if keys else ""))
        if report.dead_letters:
            print(
                "  dead letters: " + ", ".join(f"{k}={v}" for k, v in report.dead_letters.items())
            )
        print("OK: exactly once, byte-identical" if report.ok else "FAILED")
    return 0 if report.ok else 1
