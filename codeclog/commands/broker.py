"""`codeclog broker start|stop|status|fetch`: the local single-node Kafka broker."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from codeclog.broker import BrokerSettings, BrokerStatus, BrokerStatusKind, LocalBroker
from codeclog.config import ENV_DATA_DIR, ConfigError, default_data_dir
from codeclog.errors import CodeclogError, exit_code
from codeclog.kafka_jars import ENV_KAFKA_LIBS, KAFKA_VERSION, JarFetcher

DESCRIPTION = f"""\
Run a real single-node Apache Kafka {KAFKA_VERSION} broker (KRaft, broker and controller in one
JVM) on 127.0.0.1, from Maven Central jars: no Docker, no tarball. Needs Java 17+, and Maven
once to fetch the jars (about 45 MB, cached).

Each data dir holds one broker: its config, its Kafka data, broker.log and broker.json (pid,
ports, bootstrap). Several brokers with different data dirs can run at once. Other codeclog
commands find the broker of --data-dir (or ${ENV_DATA_DIR}) by themselves.
"""

EPILOG = f"""\
examples:
  codeclog broker start                      # prints the bootstrap address, e.g. 127.0.0.1:40123
  export CODECLOG_BOOTSTRAP=$(codeclog broker start)
  codeclog broker status                     # running/stopped, pid, bootstrap, data dir, log
  codeclog broker stop                       # SIGTERM, SIGKILL after 30 s; the data is kept
  codeclog broker start --data-dir /tmp/kb2  # a second, independent broker

environment:
  {ENV_DATA_DIR}    default data dir (else {default_data_dir()})
  {ENV_KAFKA_LIBS}  jar cache dir (else under the user cache dir)
  CODECLOG_JAVA / JAVA_HOME   which java to run (else `java` on PATH)

status exit codes: 0 running, 3 stopped, 1 crashed (its state file names a dead pid).
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "broker",
        help="start, stop or inspect the local Kafka broker",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="broker_action", metavar="ACTION", required=True)
    for name, summary, func in _ACTIONS:
        action = actions.add_parser(name, help=summary, description=summary)
        if name != "fetch":
            _add_data_dir(action)
        if name == "start":
            _add_start_options(action)
        action.set_defaults(func=_guarded(func))


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"the broker's data dir (default: ${ENV_DATA_DIR}, else {default_data_dir()})",
    )


def _add_start_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--heap-max-mb", type=int, default=1024, help="JVM max heap in MiB (default 1024)"
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=60.0,
        help="give up if the broker is not serving requests after this long (default 60)",
    )


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Errors a user can cause become one sentence on stderr: exit 2 for a usage or
    configuration error, else 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except (CodeclogError, ConfigError) as exc:
            print(f"codeclog broker {args.broker_action}: {exc}", file=sys.stderr)
            return exit_code(exc)

    return run


def _progress(message: str) -> None:
    print(f"codeclog: {message}", file=sys.stderr, flush=True)


def _broker(args: argparse.Namespace) -> LocalBroker:
    data_dir = args.data_dir or default_data_dir()
    heap_max_mb = getattr(args, "heap_max_mb", 1024)
    settings = BrokerSettings(
        heap_min_mb=min(256, heap_max_mb),
        heap_max_mb=heap_max_mb,
        start_timeout_s=getattr(args, "timeout_s", 60.0),
    )
    return LocalBroker(Path(data_dir), settings)


def _start(args: argparse.Namespace) -> int:
    started = time.monotonic()
    state = _broker(args).start(_progress)
    _progress(f"broker ready in {time.monotonic() - started:.1f} s; log: {state.log_path}")
    print(state.bootstrap)
    return 0


def _stop(args: argparse.Namespace) -> int:
    result = _broker(args).stop(_progress)
    if not result.was_running:
        _progress("no broker was running for that data dir")
    elif result.forced:
        _progress(f"the broker ignored SIGTERM; killed it after {result.elapsed_s:.1f} s")
    else:
        _progress(f"broker stopped in {result.elapsed_s:.1f} s; its data is kept")
    return 0


def _status(args: argparse.Namespace) -> int:
    status = _broker(args).status()
    print(format_status(status))
    codes = {BrokerStatusKind.RUNNING: 0, BrokerStatusKind.STOPPED: 3, BrokerStatusKind.CRASHED: 1}
    return codes[status.kind]


def format_status(status: BrokerStatus) -> str:
    state = status.state
    rows = [("status", status.kind.value)]
    if state is not None:
        rows += [("pid", str(state.pid)), ("bootstrap", state.bootstrap)]
        rows += [("cluster id", state.cluster_id), ("started at", state.started_at)]
    rows += [("data dir", str(status.data_dir)), ("log", str(status.log_path))]
    return "\n".join(f"{key + ':':<12}{value}" for key, value in rows)


def _fetch(_args: argparse.Namespace) -> int:
    print(JarFetcher().ensure(_progress))
    return 0


_ACTIONS: tuple[tuple[str, str, Callable[[argparse.Namespace], int]], ...] = (
    ("start", "start the broker (fetch jars, format the dir first if needed)", _start),
    ("stop", "stop the broker: SIGTERM, then SIGKILL after 30 s; data is kept", _stop),
    ("status", "print running/stopped, pid, bootstrap, data dir and log path", _status),
    ("fetch", "fetch (or verify) the broker's jars and print their dir", _fetch),
)
