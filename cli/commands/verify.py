"""`codeclog verify`: every decode window exactly once on the audio topic, byte-identical."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from codeclog.cli.config import (
    add_kafka_args,
    add_limit_args,
    kafka_client_config,
    limit_options,
    topics_config,
)
from codeclog.cli.parsing import Subparsers, add_command, add_flag
from codeclog.consumers.readers.audio_compare import DEFAULT_MAX_ABS_LSB, DEFAULT_MIN_SNR_DB
from codeclog.consumers.stream.fold.state import Policy

EPILOG = """\
Exit codes: 0 every window of the offline replay appears exactly once on the audio topic with
the same bytes (or, for audio written in another determinism domain, within the numeric
bound); 1 something is missing, duplicated, unexpected, different or corrupt, or the group of
--group is not drained; 2 usage error.

Comparison: every audio record names the determinism domain that decoded it (torch release,
kernels, CPU vendor and ISA or GPU model). A window written in the replay's own domain must be
byte-identical; one written in another domain (native kernels on another CPU, a GPU) must be
byte-identical or within --max-abs-lsb and --min-snr-db, and the summary says how many windows
each comparison judged. --kernels auto (the default) replays with native kernels when every
window was written in this machine's native domain, else with the portable kernels (the same
bytes on every x86-64 CPU). Audio written by a causal-HiFT member (its domain ends in
":causal", `vocode --hift causal`) is replayed with the causal HiFT. Every payload is
rehashed: bytes that do not match their own sha256 field are reported as corrupt.

It replays the whole chunk topic offline (same fold, same vocoder) and reads the audio topic
with read_committed, so run it when the consumer is idle (after `codeclog vocode
--exit-when-idle`, or on a quiet stack). With --group it first waits (up to --drain-timeout
seconds) until that consumer group is drained: every partition of the chunk topic with data
committed to its end, partitions it never committed on included (not `codeclog lag --check`
OK, which a consumer a few records behind also passes).
"""


def register(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "verify",
        "check the audio topic against an offline replay of the chunk topic",
        "An operator's oracle: replays the chunk topic offline and checks that "
        "every decode window appears exactly once on the audio topic and that each request's "
        "audio is byte-identical to the replay.",
        EPILOG,
    )
    add_kafka_args(parser)
    parser.add_argument("--vocoder", default="tiny", help="'tiny' or a checkpoint dir")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--kernels",
        choices=("auto", "portable", "native"),
        default="auto",
        help="replay kernels (default auto: reproduce the audio's domain when this machine can)",
    )
    parser.add_argument(
        "--max-abs-lsb",
        type=int,
        default=DEFAULT_MAX_ABS_LSB,
        metavar="N",
        help=f"across domains: largest per-sample difference (default {DEFAULT_MAX_ABS_LSB})",
    )
    parser.add_argument(
        "--min-snr-db",
        type=float,
        default=DEFAULT_MIN_SNR_DB,
        metavar="DB",
        help=f"across domains: smallest window SNR (default {DEFAULT_MIN_SNR_DB:g} dB)",
    )
    parser.add_argument(
        "--policy", choices=[p.value for p in Policy], default=Policy.TOLERANT.value
    )
    add_limit_args(parser)
    add_flag(parser, "--json", help="print the full report as JSON")
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
    from codeclog.lag.drain import undrained, wait_drained
    from codeclog.lag.readers import MeasureError

    try:
        report = wait_drained(client_config, group, topic, max(0.0, timeout_s))
    except MeasureError as exc:
        return f"cannot tell whether group {group} is drained: {exc}"
    if report.drained:
        return None
    return f"group {group} is not drained after {timeout_s:g} s: " + "; ".join(undrained(report))


def run(args: argparse.Namespace) -> int:
    client_config = kafka_client_config(args)
    topics = topics_config(args)
    limits = limit_options(args)
    if args.group is not None:
        problem = _not_drained(client_config, args.group, topics.chunks, args.drain_timeout)
        if problem is not None:
            print(f"codeclog verify: {problem}", file=sys.stderr)
            return 1
    from codeclog.consumers.readers.audio_compare import Bound
    from codeclog.consumers.readers.verify import verify

    def progress(line: str) -> None:
        print(line, file=sys.stderr)

    bound = Bound(args.max_abs_lsb, args.min_snr_db)
    factory = _engine_factory(args.vocoder, args.device, args.kernels)
    report = verify(client_config, topics, factory, Policy(args.policy), progress, bound, limits)
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
        print(
            f"  corrupt: {len(report.corrupt)}"
            + (f" e.g. {report.corrupt[:3]}" if report.corrupt else "")
        )
        print(_comparison_line(report))
        print(f"  open streams: {report.stream_limit}")
        if report.dead_letters:
            print(
                "  dead letters: " + ", ".join(f"{k}={v}" for k, v in report.dead_letters.items())
            )
        print(_verdict(report))
    return 0 if report.ok else 1


def _engine_factory(spec: str, device: str, kernels: str) -> Callable[[frozenset[str]], Any]:
    def build(domains: frozenset[str]) -> Any:
        from codeclog.vocoder.domain import (
            engine_domain_suffix,
            hift_variant_reproducing,
            kernels_reproducing,
        )
        from codeclog.vocoder.engine import Code2WavEngine

        hift = hift_variant_reproducing(domains)  # the audio's own HiFT variant (":causal")
        suffix = engine_domain_suffix("float32", hift, "exact")
        chosen = (
            kernels_reproducing(domains, device, suffix=suffix) if kernels == "auto" else kernels
        )
        return Code2WavEngine.from_spec(spec, device=device, kernels=chosen, hift=hift)

    return build


def _comparison_line(report: Any) -> str:
    domains = ", ".join(f"{d or 'unknown (v1)'}: {n}" for d, n in report.domains.items())
    counts = report.comparisons
    text = (
        f"  replayed in {report.replay_domain}; audio written in {domains or 'no domain'}; "
        f"compared bytewise {counts.get('bytes', 0)}"
    )
    if counts.get("bound"):
        text += (
            f", by the bound {counts['bound']} (worst {report.worst_bound_lsb} LSB, limits "
            f"{report.bound['max_abs_lsb']:g} LSB / {report.bound['min_snr_db']:g} dB)"
        )
    return text


def _verdict(report: Any) -> str:
    if not report.ok:
        return "FAILED"
    if report.comparisons.get("bound"):
        return "OK: exactly once; byte-identical within the domain, within the bound across domains"
    return "OK: exactly once, byte-identical"
