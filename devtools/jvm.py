"""Kafka's JVMs: the java that runs them (17+), their command lines (the broker, the storage tool
that formats a log dir), their log (a banner per start, rotation, the tail) and the line of a
failed one's log that names why; the broker JVM runs detached, its stdout and stderr in its log."""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from codeclog.devtools.broker_errors import (
    BrokerFormatError,
    BrokerStartError,
    JavaNotFoundError,
    JavaTooOldError,
    PortInUseError,
)
from codeclog.devtools.host import parent_death_hook
from codeclog.devtools.jars import KAFKA_VERSION, runtime_file

ENV_JAVA = "CODECLOG_JAVA"
MIN_JAVA_MAJOR = 17
FORMAT_TIMEOUT_S = 120.0
LOG_ROTATE_BYTES = 20 * 1024 * 1024
START_BANNER = "==== codeclog broker start"

# ----------------------------------------------------------------------------- java


def resolve_java(explicit: str | None) -> str:
    """The java executable to use, checked to exist and to be Java 17+."""
    candidate, origin = _java_candidate(explicit)
    found = shutil.which(candidate)
    if found is None:
        raise JavaNotFoundError(
            f"Java {MIN_JAVA_MAJOR}+ is needed to run the local Kafka broker, but {origin} "
            f"`{candidate}` was not found; install a JDK (e.g. `apt-get install "
            f"openjdk-{MIN_JAVA_MAJOR}-jre-headless`) or point JAVA_HOME or ${ENV_JAVA} at one"
        )
    _check_java_version(found)
    return found


def _java_candidate(explicit: str | None) -> tuple[str, str]:
    if explicit:
        return explicit, "the configured java"
    if os.environ.get(ENV_JAVA):
        return os.environ[ENV_JAVA], f"${ENV_JAVA}"
    if os.environ.get("JAVA_HOME"):
        return str(Path(os.environ["JAVA_HOME"]) / "bin" / "java"), "$JAVA_HOME's"
    return "java", "the PATH's"


def _check_java_version(java: str) -> None:
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaNotFoundError(f"`{java} -version` failed: {exc}") from exc
    major = parse_java_major(done.stderr + done.stdout)
    if major is not None and major < MIN_JAVA_MAJOR:
        raise JavaTooOldError(
            f"Kafka {KAFKA_VERSION} brokers need Java {MIN_JAVA_MAJOR}+, but {java} is "
            f"Java {major}; install a newer JDK or point JAVA_HOME or ${ENV_JAVA} at one"
        )


_JAVA_VERSION_RE = re.compile(r'version "(\d+)(?:\.(\d+))?')


def parse_java_major(version_output: str) -> int | None:
    """Major version from `java -version` output ("1.8.0_x" is 8, "17.0.15" is 17)."""
    match = _JAVA_VERSION_RE.search(version_output)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:
        return int(match.group(2))
    return major


# ----------------------------------------------------------------------------- command lines


def broker_command(
    java: str,
    libs_dir: Path,
    properties_path: Path,
    *,
    logs_dir: Path,
    heap_mb: tuple[int, int],
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The broker JVM: heap `heap_mb` (min, max) MiB, Kafka's own launcher flags, then
    `extra_args` (after ours, so they win)."""
    return [
        java,
        f"-Xms{heap_mb[0]}m",
        f"-Xmx{heap_mb[1]}m",
        # Kafka's own launcher flags (kafka-run-class.sh).
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:InitiatingHeapOccupancyPercent=35",
        "-XX:+ExplicitGCInvokesConcurrent",
        "-Djava.awt.headless=true",
        f"-Dkafka.logs.dir={logs_dir}",
        f"-Dlog4j2.configurationFile={runtime_file('log4j2.properties')}",
        *extra_args,
        "-cp",
        str(libs_dir / "*"),
        "kafka.Kafka",
        str(properties_path),
    ]


def format_command(
    java: str, libs_dir: Path, properties_path: Path, cluster_id: str, args: Sequence[str]
) -> list[str]:
    """`kafka.tools.StorageTool format` of the log dir that `properties_path` names, with
    the mode's `args` (--standalone, --add-scram ...)."""
    return [
        java,
        "-Xmx256m",
        f"-Dlog4j2.configurationFile={runtime_file('tools-log4j2.properties')}",
        "-cp",
        str(libs_dir / "*"),  # a literal *: java expands the classpath wildcard itself
        "kafka.tools.StorageTool",
        "format",
        *args,
        "-t",
        cluster_id,
        "-c",
        str(properties_path),
    ]


def run_format(command: list[str], log_dirs: Path) -> None:
    """Run a `format_command` to its end; BrokerFormatError names why it failed."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=FORMAT_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BrokerFormatError(
            f"formatting {log_dirs} did not finish within {FORMAT_TIMEOUT_S:.0f} s"
        ) from exc
    if done.returncode != 0:
        raise BrokerFormatError(
            f"formatting {log_dirs} failed (exit {done.returncode}): "
            f"{telling_line(done.stderr + done.stdout)}"
        )


def read_cluster_id(meta: Path) -> str:
    """The cluster id a format wrote into a log dir's meta.properties."""
    for line in meta.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "cluster.id":
            return value.strip()
    raise BrokerFormatError(f"{meta} has no cluster.id; delete the data dir and start again")


# ----------------------------------------------------------------------------- the log


def spawn_logged(
    command: list[str], log_path: Path, cwd: Path, started_at: str, die_with_parent: bool
) -> subprocess.Popen[bytes]:
    """Start `command` detached, its output appended to `log_path` (rotated first) after a
    banner line; with `die_with_parent` the kernel SIGTERMs it when this process dies."""
    rotate_log(log_path)
    hook = parent_death_hook() if die_with_parent else None
    with log_path.open("ab") as log:
        log.write(f"{START_BANNER} at {started_at} ====\n".encode())
        log.flush()
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,  # detached: survives the CLI and terminal signals
            preexec_fn=hook,
        )


def rotate_log(log_path: Path) -> None:
    """Past LOG_ROTATE_BYTES the log becomes `<name>.1` (replacing the one before)."""
    with contextlib.suppress(OSError):
        if log_path.stat().st_size > LOG_ROTATE_BYTES:
            log_path.replace(log_path.with_name(log_path.name + ".1"))


def log_tail(log_path: Path, max_lines: int = 40) -> str:
    """The last lines the JVM logged in its latest run (since the last banner)."""
    try:
        with log_path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 256 * 1024))
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return ""
    text = text[text.rfind(START_BANNER) :] if START_BANNER in text else text
    return "\n".join(text.splitlines()[-max_lines:])


def exit_error(code: int, log_path: Path) -> BrokerStartError:
    """What to raise for a broker JVM that exited with `code` during start-up."""
    # The cause is often a screenful above the end: search a long tail, show a short one.
    long_tail = log_tail(log_path, max_lines=400)
    short_tail = "\n".join(long_tail.splitlines()[-40:])
    if "Address already in use" in long_tail:
        return PortInUseError("a broker port was taken by another process", short_tail)
    return BrokerStartError(
        f"the Kafka broker exited during start-up with code {code} (log {log_path}): "
        f"{telling_line(long_tail)}",
        short_tail,
    )


_EXCEPTION_LINE_RE = re.compile(r"^(Caused by: )?[\w.$]+(Exception|Error)(: |$)")


def telling_line(log_tail: str) -> str:
    """The line of a failed start most likely to name the cause: a Java exception's message,
    else the first ERROR/FATAL log line, else the last line."""
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    exceptions = [line for line in lines if _EXCEPTION_LINE_RE.match(line)]
    errors = [line for line in lines if " ERROR " in line or " FATAL " in line]
    chosen = (exceptions or errors or lines or ["(the log is empty)"])[0]
    if not exceptions and not errors:
        chosen = lines[-1] if lines else chosen
    return chosen[:400]


def iso_utc(unix_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(unix_s, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="seconds")
