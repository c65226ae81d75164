"""`codeclog verify`: every decode window exactly once on the audio topic, byte-identical."""

from __future__ import annotations

import argparse
import json
import sys

from codeclog.config import ConfigError, add_kafka_args, kafka_client_config, topics_config
from consumers.fold.machine import Policy

EPILOG = """\
Exit codes: 0 every window of the offline replay appears exactly once on the audio topic with
the same SHA-256; 1 something is missing, duplicated, unexpected or different, or the group of
--group is not drained; 2 usage error.

It replays the whole chunk topic offline (same fold, same vocoder) and reads the audio topic
with read_committed, so run it when the consumer is idle (after `codeclog vocode
--exit-when-idle`, or on a quiet stack). With --group it first waits (up to --drain-timeout
seconds) until that consumer group is drained: every partition of the chunk topic with data
committed to its end, partitions it never committed on included (not `codeclog lag --check`
OK, which a consumer a few records behind also passes).
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
    parser.add_argument(
        "--group",
        help="first wait until this consumer group is drained (e.g. codeclog-vocoder)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="how long to wait for --group to drain (default %(default)s)",
    )
    parser.set_defaults(func=run)


def _not_drained(
    client_config: dict[str, str], group: str, topic: str, timeout_s: float
) -> str | None:
    """None once `group` is drained on `topic`, else one sentence saying why not."""
    from lag.drain import undrained, wait_drained
    from lag.measure import MeasureError

    try:
        report = wait_drained(client_config, group, topic, max(0.0, timeout_s))
    except MeasureError as exc:
        return f"cannot tell whether group {group} is drained: {exc}"
    if report.drained:
        return None
    return f"group {group} is not drained after {timeout_s:g} s: " + "; ".join(undrained(report))


def run(args: argparse.Namespace) -> int:
    try:
        client_config = kafka_client_config(args)
        topics = topics_config(args)
    except ConfigError as exc:
        print(f"codeclog verify: {exc}", file=sys.stderr)
        return 2
    if args.group is not None:
        problem = _not_drained(client_config, args.group, topics.chunks, args.drain_timeout)
        if problem is not None:
            print(f"codeclog verify: {problem}", file=sys.stderr)
            return 1
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
