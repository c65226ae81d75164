"""Configuration shared by every command: where the cluster is, client properties, topic names.
Resolution and checks: README, "Topics and configuration"."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import Any

from codeclog.consumers.stream.limit import LimitOptions
from codeclog.errors import CodeclogError, ConfigError
from codeclog.paths import default_data_dir
from codeclog.topics_config import TopicsConfig
from codeclog.user_files import read_text

ENV_BOOTSTRAP = "CODECLOG_BOOTSTRAP"


class NoClusterError(CodeclogError):
    """No cluster was named and no local broker runs: a failure (exit 1), not a usage error."""


def read_properties(path: str | Path) -> dict[str, str]:
    """Parse a librdkafka properties file: `key=value` lines, blank lines and # comments."""
    props: dict[str, str] = {}
    lines = read_text(path, "--kafka-config").splitlines()
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{path}:{number}: expected key=value, got {stripped!r}")
        props[key.strip()] = value.strip()
    return props


def add_kafka_args(parser: argparse.ArgumentParser) -> None:
    """The options every Kafka-facing command takes."""
    group = parser.add_argument_group("cluster")
    group.add_argument(
        "--bootstrap",
        help=f"bootstrap servers (default: ${ENV_BOOTSTRAP}, else the local broker)",
    )
    group.add_argument(
        "--kafka-config",
        metavar="FILE",
        help="librdkafka properties file (security.protocol, sasl.*, ssl.*, ...)",
    )
    group.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="data dir of the local broker to use when no bootstrap is given",
    )
    group.add_argument(
        "--topics-config",
        metavar="FILE",
        help="JSON object renaming topics / setting partitions (keys: "
        + ", ".join(f.name for f in dataclasses.fields(TopicsConfig))
        + ")",
    )


def resolve_bootstrap(args: argparse.Namespace, from_file: str | None = None) -> str:
    """The bootstrap address, first match wins: --bootstrap, `from_file` (the
    `bootstrap.servers` of the --kafka-config file, if it has one), $CODECLOG_BOOTSTRAP, the
    local broker of --data-dir (README, "Topics and configuration"). When a later source is set
    too and differs, one line on stderr says which was used."""
    sources = [
        ("--bootstrap", getattr(args, "bootstrap", None)),
        (f"bootstrap.servers in {getattr(args, 'kafka_config', None)}", from_file),
        (f"${ENV_BOOTSTRAP}", os.environ.get(ENV_BOOTSTRAP)),
    ]
    given = [(name, str(value)) for name, value in sources if value]
    if given:
        name, value = given[0]
        overridden = [f"{other} ({v})" for other, v in given[1:] if v != value]
        if overridden:
            print(
                f"codeclog: using the cluster at {value} from {name}; ignoring "
                + ", ".join(overridden),
                file=sys.stderr,
            )
        return value
    from codeclog.devtools.cluster import (
        local_bootstrap,  # local import: it pulls subprocess helpers
    )

    data_dir = getattr(args, "data_dir", None) or default_data_dir()
    found = local_bootstrap(Path(data_dir))
    if found is None:
        raise NoClusterError(
            f"no Kafka cluster: no local broker is running for {data_dir}. "
            f"Run `codeclog broker start`, or pass --bootstrap / set {ENV_BOOTSTRAP}."
        )
    return found


def kafka_client_config(args: argparse.Namespace) -> dict[str, str]:
    """librdkafka properties for any client: bootstrap plus the user's properties file."""
    config: dict[str, str] = {}
    path = getattr(args, "kafka_config", None)
    if path:
        config.update(read_properties(path))
        check_client_properties(config, f"--kafka-config {path}")
    config["bootstrap.servers"] = resolve_bootstrap(args, config.get("bootstrap.servers"))
    from codeclog.kafka.access import probe_access  # local import: keeps this module light

    probe_access(config)  # a wrong password or certificate: one line, exit 2, not a hang
    return config


def check_client_properties(props: dict[str, str], source: str) -> None:
    """Let librdkafka judge the properties (unknown names, bad values) before any client
    connects: a client built from them alone, no bootstrap, so nothing connects."""
    from confluent_kafka import KafkaException, Producer

    quiet = logging.getLogger("codeclog.kafka.config-check")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    settings: dict[str, Any] = {k: v for k, v in props.items() if k != "bootstrap.servers"}
    settings["logger"] = quiet
    try:
        Producer(settings)
    except (KafkaException, ValueError, TypeError) as exc:
        error = exc.args[0] if exc.args else exc
        text = error.str() if hasattr(error, "str") else str(error)
        raise ConfigError(f"{source}: {' '.join(str(text).split())}") from exc


def port_problem(option: str, port: int | None) -> str | None:
    """Why `port` cannot be served on (a usage error), or None; None is not asked for."""
    if port is not None and not 0 <= port <= 65535:
        return f"{option} must be a TCP port (0-65535), got {port}"
    return None


def topics_config(args: argparse.Namespace) -> TopicsConfig:
    return TopicsConfig.load(getattr(args, "topics_config", None))


def add_limit_args(parser: argparse.ArgumentParser) -> None:
    """--max-open-streams and --state-budget-mb: `vocode` applies them, `verify` and `replay`
    apply the same ones to reproduce its evictions (consumers.stream.limit)."""
    parser.add_argument(
        "--max-open-streams",
        type=int,
        default=1024,
        metavar="N",
        help="open streams over the whole group: N // P per partition of the chunk topic (at "
        "least 1); a stream opened beyond it evicts its partition's least recently active "
        "stream (dead letter 'evicted'). Default %(default)s",
    )
    parser.add_argument(
        "--state-budget-mb",
        type=float,
        default=None,
        metavar="MB",
        help="a member's memory for open streams' vocoder state, in MB (10^6 bytes): every "
        "open stream is charged its state's peak size (195.9 MB full size), B // size // P "
        "streams per partition, when fewer than --max-open-streams allows. Default: 60%% of "
        "the device's free memory after the model loaded on CUDA, 8 GiB on the CPU; verify and "
        "replay take the members' value to reproduce their evictions",
    )


def limit_options(args: argparse.Namespace) -> LimitOptions:
    """The limit options, checked (ConfigError: exit 2)."""
    if args.max_open_streams < 1:
        raise ConfigError(f"--max-open-streams must be >= 1, got {args.max_open_streams}")
    if args.state_budget_mb is not None and not args.state_budget_mb > 0:
        raise ConfigError(f"--state-budget-mb must be > 0, got {args.state_budget_mb:g}")
    return LimitOptions(args.max_open_streams, args.state_budget_mb)
