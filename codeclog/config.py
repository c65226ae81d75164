"""Configuration shared by every command: where the cluster is, client properties, topic names.

Resolution of the bootstrap address, first match wins (the more explicit source wins; when a
later source is set too and differs, one line on stderr says which was used):
1. `--bootstrap HOST:PORT`;
2. `bootstrap.servers` in the `--kafka-config` file;
3. the environment variable `CODECLOG_BOOTSTRAP`;
4. the local broker started by `codeclog broker start` for `--data-dir` (default: under the
   user's cache dir), read from its state file.

`--kafka-config FILE` adds librdkafka properties (one `key=value` per line, `#` comments), so
users can set `security.protocol`, `sasl.*` and `ssl.*` for their own clusters. The file is
checked by librdkafka itself before anything connects: an unknown property or a bad value is
a ConfigError (one line, exit 2).
`--topics-config FILE` (JSON) renames topics and sets partition counts; unknown keys are refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from codeclog.errors import CodeclogError, UsageError

ENV_BOOTSTRAP = "CODECLOG_BOOTSTRAP"
ENV_DATA_DIR = "CODECLOG_DATA_DIR"


class ConfigError(UsageError):
    """A configuration value is missing, malformed or contradictory."""


class NoClusterError(CodeclogError):
    """No cluster was named and no local broker runs: a failure (exit 1), not a usage error."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "codeclog"


def default_data_dir() -> Path:
    env = os.environ.get(ENV_DATA_DIR)
    return Path(env) if env else default_cache_dir() / "broker"


@dataclasses.dataclass(frozen=True)
class TopicsConfig:
    """Topic names and partition counts. Every field is documented; unknown keys are errors."""

    chunks: str = "codec.chunks"  # codec chunks and control events, keyed by request id
    audio: str = "codec.audio"  # audio chunks, keyed by request id
    dlq: str = "codec.dlq"  # dead letters: reason, position, details, raw bytes
    progress: str = "codec.progress"  # compacted: per-request recovery checkpoints
    partitions: int = 8  # partitions of the chunks, audio and progress topics
    dlq_partitions: int = 1

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TopicsConfig:
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ConfigError(f"unknown topic config keys: {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for key, value in raw.items():
            expected = int if key.endswith("partitions") else str
            if not isinstance(value, expected) or isinstance(value, bool):
                raise ConfigError(f"topic config {key!r} must be {expected.__name__}")
            if isinstance(value, int) and value < 1:
                raise ConfigError(f"topic config {key!r} must be >= 1, got {value}")
            if expected is str and not value:
                raise ConfigError(f"topic config {key!r} must not be empty")
            values[key] = value
        config = cls(**values)
        names = [config.chunks, config.audio, config.dlq, config.progress]
        if len(set(names)) != len(names):
            raise ConfigError("topic names must be distinct")
        return config

    @classmethod
    def load(cls, path: str | Path | None) -> TopicsConfig:
        if path is None:
            return cls()
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read topics config {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"topics config {path} must be a JSON object")
        return cls.from_dict(raw)


def read_properties(path: str | Path) -> dict[str, str]:
    """Parse a librdkafka properties file: `key=value` lines, blank lines and # comments."""
    props: dict[str, str] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read kafka config {path}: {exc}") from exc
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
    """The bootstrap address (module docstring: first match wins). `from_file` is the
    `bootstrap.servers` of the --kafka-config file, if it has one."""
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
    from codeclog.broker import local_bootstrap  # local import: broker pulls subprocess helpers

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


def topics_config(args: argparse.Namespace) -> TopicsConfig:
    return TopicsConfig.load(getattr(args, "topics_config", None))
