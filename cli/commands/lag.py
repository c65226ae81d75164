"""`codeclog lag` (a lag table, a health check) and `codeclog lag-exporter` (Prometheus)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from codeclog.cli.config import (
    ConfigError,
    add_kafka_args,
    kafka_client_config,
    port_problem,
    topics_config,
)
from codeclog.cli.parsing import (
    Subparsers,
    add_command,
    add_flag,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from codeclog.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CodeclogError, exit_code
from codeclog.lag.evaluator import EvaluatorConfig, GroupStatus, LagConfigError

if TYPE_CHECKING:  # the runtime imports are local: `codeclog --help` need not load librdkafka
    from codeclog.lag.monitor import LagMonitor
    from codeclog.lag.report import GroupReport

DEFAULT_GROUP = "codeclog-vocoder"  # the vocoder consumer's default group.id
# exit codes (codeclog.errors): --check 1 when not OK or the lag could not be measured
OFFSET_RESETS = ("earliest", "latest")  # lag.measure.OFFSET_RESETS (not imported: librdkafka)

LAG_DESCRIPTION = """\
Show how far a consumer group is behind on the codec chunk topic, per partition:
  committed    the group's committed offset (next record to consume)
  LSO          the last stable offset: the end a read_committed consumer can reach, so a fully
               consumed transactional topic shows lag 0, not 1 (the commit marker)
  lag          records between the two; "4*": the group has no committed offset there, so the
               lag is measured from the reset position (--offset-reset; earliest, as the
               vocoder consumer uses: the log start offset), never hidden as "-"
  time lag s   age of the record at the committed offset (read from the log, not interpolated)
  audio lag s  seconds of codec frames not yet vocoded (40 ms a frame): exact when the reader
               reaches the end, else the mean of the first --read-records records x lag
  status       OK, WARN, STOP, STALL, REWIND or LAGGING; Burrow's rules over a window:
               STOP    no progress for --stuck-after seconds, lag > 0, nobody holds it
               STALL   no progress for --stuck-after seconds while a live member holds it
               REWIND  the committed offset went back and has not recovered
               WARN    lag grew by more than --warn-growth over >= --warn-samples samples
               LAGGING time lag > --max-time-lag or audio lag > --max-audio-lag while the
                       window is young (below)

A window needs --stuck-after seconds to tell a stopped consumer from a live one. Until then
(always for a one-shot `codeclog lag` or `--check`, and for the first --stuck-after seconds
of --watch) absolute rules stand in: LAGGING above, and the group rules
  the group does not exist    the cluster does not know the group id (no members, no offsets)
  no members while records wait                 (checked at every sample, not only when young)
  never committed while its topic has data
The defaults are sized for real-time speech: a listener's playback buffer holds about a second,
so a chunk 3 s old is an audible gap, and 5 s of speech waiting on one partition is more than
its sessions produce during one normal consumer step (demo: chunk latency p99 1.7 s).

The group is ERR if any partition is STOP, STALL, REWIND or LAGGING or a group rule holds,
WARN if any partition is WARN, else OK. The group line shows its state and member count.
"""

LAG_EPILOG = """\
exit status: 0 OK; 1 with --check when the group is not OK (WARN or ERR: every case above),
or when the lag could not be measured (cluster unreachable, topic missing); 2 usage or
configuration errors. Without --check a measured lag exits 0 whatever its status.

examples:
  codeclog lag                                   # the vocoder group on codec.chunks, once
  codeclog lag --check                           # one sample: absolute rules, exit 0 or 1
  codeclog lag --watch --interval 2              # a fresh table every 2 s (Ctrl-C stops)
  codeclog lag --check --samples 10 --interval 4 # a 36 s health check with the window rules
  codeclog lag --group my-group --json           # machine-readable (null = unknown)
"""

EXPORTER_DESCRIPTION = """\
Serve consumer-lag metrics for Prometheus on http://ADDRESS:PORT/metrics, named like
kafka-lag-exporter (kafka_consumergroup_group_lag, _group_lag_seconds, _group_max_lag, ...) so
its dashboards work, plus codeclog_audio_lag_seconds, codeclog_partition_status{status} and
codeclog_group_status{status} (1 for the current status, 0 for the others).

Every --interval seconds each group is measured and evaluated; the evaluator's window lives
in this process, across scrapes. Unknown values are absent series, never NaN. A failed
measurement drops the group's series (so `absent()` alerts fire) and counts in
codeclog_lag_measure_failures_total. Alert rules: deploy/prometheus/alerts.yml.
Needs the metrics extra (prometheus-client).
"""

EXPORTER_EPILOG = """\
examples:
  codeclog lag-exporter                               # the vocoder group, port 9310
  codeclog lag-exporter --port 9310 --group codeclog-vocoder --group other-group
  curl -s localhost:9310/metrics | grep codeclog_
"""


def register(subparsers: Subparsers) -> None:
    _register_lag(subparsers)
    _register_exporter(subparsers)


def _register_lag(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "lag",
        "consumer lag in records, seconds and audio seconds, with Burrow-style status",
        LAG_DESCRIPTION,
        LAG_EPILOG,
    )
    parser.add_argument(
        "--group", default=DEFAULT_GROUP, help=f"consumer group (default {DEFAULT_GROUP})"
    )
    _add_sampling_args(
        parser,
        default_interval_s=5.0,
        samples=(positive_int, 1, "samples to take, --interval apart, before reporting"),
    )
    add_flag(parser, "--json", help="print JSON (one object per sample)")
    mode = parser.add_mutually_exclusive_group()
    add_flag(mode, "--watch", help="keep sampling until interrupted")
    add_flag(mode, "--check", help="exit 0 when the group is OK, else 1")
    parser.set_defaults(func=_guarded("lag", _run_lag))


def _register_exporter(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "lag-exporter",
        "serve consumer-lag metrics for Prometheus",
        EXPORTER_DESCRIPTION,
        EXPORTER_EPILOG,
    )
    parser.add_argument("--port", type=int, default=9310, help="HTTP port (default 9310; 0: any)")
    parser.add_argument("--address", default="0.0.0.0", help="bind address (default 0.0.0.0)")
    parser.add_argument(
        "--group",
        action="append",
        dest="groups",
        metavar="GROUP",
        help=f"consumer group to watch; repeat for more (default {DEFAULT_GROUP})",
    )
    parser.add_argument(
        "--cluster-name",
        default="codeclog",
        help="value of the cluster_name label (default codeclog)",
    )
    _add_sampling_args(
        parser,
        default_interval_s=10.0,
        samples=(non_negative_int, 0, "sampling rounds before it stops; 0: until interrupted"),
    )
    parser.set_defaults(func=_guarded("lag-exporter", _run_exporter))


def _add_sampling_args(
    parser: argparse.ArgumentParser,
    default_interval_s: float,
    samples: tuple[Callable[[str], int], int, str],
) -> None:
    """What both commands sample and how often; `samples` is --samples' type, default and help
    (how many samples the command takes means something else to each)."""
    parser.add_argument(
        "--topic", help="topic to measure (default: the chunks topic, codec.chunks)"
    )
    parser.add_argument(
        "--interval",
        type=positive_float,
        default=default_interval_s,
        metavar="S",
        help=f"seconds between samples (default {default_interval_s:g})",
    )
    samples_type, samples_default, samples_help = samples
    parser.add_argument(
        "--samples",
        type=samples_type,
        default=samples_default,
        metavar="N",
        help=f"{samples_help} (default {samples_default})",
    )
    parser.add_argument(
        "--read-records",
        type=positive_int,
        default=64,
        metavar="K",
        help="records decoded per lagging partition for the audio lag (default %(default)s)",
    )
    parser.add_argument(
        "--offset-reset",
        choices=OFFSET_RESETS,
        default="earliest",
        help="where the group starts on a partition without a committed offset, its "
        "auto.offset.reset; lag there is measured from it (default earliest, as the vocoder)",
    )
    _add_rule_args(parser)
    add_kafka_args(parser)
    parser.add_argument(
        "--timeout-s",
        type=positive_float,
        default=10.0,
        metavar="S",
        help="admin request timeout (default %(default)s)",
    )


def _add_rule_args(parser: argparse.ArgumentParser) -> None:
    rules = parser.add_argument_group("evaluator (Burrow-style rules)")
    defaults = EvaluatorConfig()
    options: list[tuple[str, Callable[[str], object], object, str, str]] = [
        ("--window", int, defaults.window_samples, "N", "samples kept per partition"),
        ("--allowed-lag", int, defaults.allowed_lag, "N", "lag at or below this is OK"),
        (
            "--stuck-after",
            float,
            defaults.stuck_after_ms / 1000,
            "S",
            "no progress this long while lagging is STOP (nobody holds the partition) or STALL",
        ),
        ("--warn-growth", int, defaults.warn_growth_records, "N", "WARN when lag grows by > N"),
        ("--warn-samples", int, defaults.warn_min_samples, "K", "... over at least K samples"),
        (
            "--max-time-lag",
            non_negative_float,
            defaults.max_time_lag_s,
            "S",
            "young window / one-shot: LAGGING when the oldest waiting chunk is older than S",
        ),
        (
            "--max-audio-lag",
            non_negative_float,
            defaults.max_audio_lag_s,
            "S",
            "young window / one-shot: LAGGING when more than S seconds of audio wait",
        ),
    ]
    for flag, kind, default, metavar, text in options:
        rules.add_argument(
            flag, type=kind, default=default, metavar=metavar, help=f"{text} (default {default})"
        )


def _guarded(
    name: str, func: Callable[[argparse.Namespace], int]
) -> Callable[[argparse.Namespace], int]:
    """Errors a user can cause become one sentence on stderr: exit 2 for usage and
    configuration errors, 1 for the rest (the cluster, the topic, the port)."""

    def run(args: argparse.Namespace) -> int:
        from codeclog.lag.exporter import (
            MetricsUnavailableError,  # librdkafka: only when a command runs
        )
        from codeclog.lag.readers import ClientConfigError

        usage = (ConfigError, LagConfigError, ClientConfigError, MetricsUnavailableError)
        try:
            return func(args)
        except usage as exc:
            print(f"codeclog {name}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except CodeclogError as exc:
            print(f"codeclog {name}: {exc}", file=sys.stderr)
            return exit_code(exc)  # a usage error (e.g. the port is taken) is 2

    return run


def evaluator_config(args: argparse.Namespace) -> EvaluatorConfig:
    return EvaluatorConfig(
        window_samples=args.window,
        allowed_lag=args.allowed_lag,
        stuck_after_ms=round(args.stuck_after * 1000),
        warn_growth_records=args.warn_growth,
        warn_min_samples=args.warn_samples,
        max_time_lag_s=args.max_time_lag,
        max_audio_lag_s=args.max_audio_lag,
    )


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def _run_lag(args: argparse.Namespace) -> int:
    from codeclog.lag.measure import LagMeasurer
    from codeclog.lag.monitor import LagMonitor

    config = evaluator_config(args)
    client = kafka_client_config(args)
    topic = args.topic or topics_config(args).chunks
    measurer = LagMeasurer(
        client,
        read_records=args.read_records,
        timeout_s=args.timeout_s,
        offset_reset=args.offset_reset,
    )
    monitor = LagMonitor(client, args.group, topic, config=config, measurer=measurer)
    try:
        code = _sample_loop(args, monitor)
        _note_refusal(measurer, "codeclog lag")
        return code
    finally:
        monitor.close()
        measurer.close()


def _sample_loop(args: argparse.Namespace, monitor: LagMonitor) -> int:
    taken = 0
    report: GroupReport | None = None
    while args.watch or taken < args.samples:
        if taken:
            time.sleep(args.interval)
        report = monitor.sample(wall_clock_ms())
        taken += 1
        if args.watch:
            _print_report(args, report)
        elif taken < args.samples:
            print(f"sampled {taken}/{args.samples} ...", file=sys.stderr, flush=True)
    assert report is not None
    if not args.watch:
        _print_report(args, report)
    if args.check and report.status is not GroupStatus.OK:
        return EXIT_FAILURE
    return EXIT_OK


def _print_report(args: argparse.Namespace, report: GroupReport) -> None:
    from codeclog.lag.report import format_table, to_dict

    if args.json:
        print(json.dumps(to_dict(report), sort_keys=True), flush=True)
        return
    if args.watch:
        stamp = time.strftime("%H:%M:%S", time.localtime(report.observed_at_ms / 1000))
        print(f"\n-- {stamp}", flush=True)
    print(format_table(report), flush=True)


def _run_exporter(args: argparse.Namespace) -> int:
    from codeclog.lag.exporter import LagCollector, sample_all, serve
    from codeclog.lag.measure import LagMeasurer
    from codeclog.lag.monitor import LagMonitor

    if problem := port_problem("--port", args.port):
        raise ConfigError(problem)
    config = evaluator_config(args)
    client = kafka_client_config(args)
    topic = args.topic or topics_config(args).chunks
    groups = list(dict.fromkeys(args.groups or [DEFAULT_GROUP]))
    measurer = LagMeasurer(
        client,
        read_records=args.read_records,
        timeout_s=args.timeout_s,
        offset_reset=args.offset_reset,
    )
    monitors = [LagMonitor(client, g, topic, config=config, measurer=measurer) for g in groups]
    collector = LagCollector(args.cluster_name)
    port = serve(collector, args.port, args.address)
    print(
        f"lag-exporter: serving http://{args.address}:{port}/metrics", file=sys.stderr, flush=True
    )
    rounds = 0
    while args.samples <= 0 or rounds < args.samples:
        if rounds:
            time.sleep(args.interval)
        sample_all(monitors, collector, wall_clock_ms(), _progress)
        if rounds == 0:
            _note_refusal(measurer, "lag-exporter")
        rounds += 1
    measurer.close()
    return EXIT_OK


def _note_refusal(measurer: Any, name: str) -> None:
    """One line when the broker refused the head read (a monitor without READ on payloads)."""
    if measurer.read_refusal:
        print(f"{name}: note: {measurer.read_refusal}", file=sys.stderr, flush=True)


def _progress(line: str) -> None:
    print(f"lag-exporter: {line}", file=sys.stderr, flush=True)
