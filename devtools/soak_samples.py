"""What the soak (`python -m bench.soak`) samples, and how: a process's resident size, open fds and
threads from /proc, a Prometheus page's values, and one sample of the whole run (every process,
the members' figures, the group's lag). Reasons: docs/soak.md, "What it samples"."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PROC = Path("/proc")
KIB = 1024
# What a member's Prometheus page (`vocode --metrics-port`) gives the soak, by metric name
MEMBER_METRICS = {
    "windows": "codeclog_vocoder_windows_total",
    "open_streams": "codeclog_vocoder_open_streams",
    "fold_state_bytes": "codeclog_vocoder_fold_state_bytes",
    "fold_requests": "codeclog_vocoder_fold_requests",
}


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process at one moment: its pid, resident set, open fds and threads."""

    pid: int
    rss_bytes: int
    fds: int
    threads: int
    kafka_handles: int = 0  # librdkafka clients alive: one "rdk:main" thread each


KAFKA_HANDLE_THREAD = "rdk:main"  # the main thread of each librdkafka handle
HANDLE_SETTLE_S = 0.02  # a new thread names itself well within this


def parse_status(text: str) -> tuple[int, int]:
    """(resident bytes, threads) from the text of /proc/<pid>/status (VmRSS is in kB; a
    kernel thread or a zombie has none: 0)."""
    rss_kib = threads = 0
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "VmRSS":
            rss_kib = int(value.split()[0])
        elif name == "Threads":
            threads = int(value.split()[0])
    return rss_kib * KIB, threads


def sample_process(pid: int | None, proc: Path = PROC) -> ProcessSample | None:
    """The process now; None when there is none (not started, exited, or gone meanwhile)."""
    if pid is None:
        return None
    try:
        rss, threads = parse_status((proc / str(pid) / "status").read_text())
        fds = len(os.listdir(proc / str(pid) / "fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return ProcessSample(pid, rss, fds, threads, kafka_handles(pid, proc))


def kafka_handles(pid: int, proc: Path = PROC, settle_s: float = HANDLE_SETTLE_S) -> int:
    """How many librdkafka clients (producers, consumers, admin clients) the process holds:
    its threads named KAFKA_HANDLE_THREAD. A handle replaced and never destroyed shows here
    before its threads and sockets are noticed among the others.

    A thread the main thread starts (a broker thread) carries its creator's name until it
    names itself, so a thread is counted only if it still has the name settle_s later: a
    reading taken as a handle met a new broker counted one handle too many."""
    named = _threads_named(pid, proc, KAFKA_HANDLE_THREAD, None)
    if not named:
        return 0
    time.sleep(settle_s)
    return len(_threads_named(pid, proc, KAFKA_HANDLE_THREAD, named))


def _threads_named(pid: int, proc: Path, name: str, among: set[str] | None) -> set[str]:
    """The process's threads (among those given, or all) whose name is name now."""
    try:
        tasks = among if among is not None else set(os.listdir(proc / str(pid) / "task"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return set()
    found = set()
    for task in tasks:
        try:
            comm = (proc / str(pid) / "task" / task / "comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # the thread ended meanwhile
        if comm == name:
            found.add(task)
    return found


def metric_values(text: str) -> dict[str, float]:
    """A Prometheus text page as {metric name: value}, the values of every label set of a
    name added up (comments, NaN and unparsable lines are skipped)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, rest = line.rpartition(" ")
        if not series:
            continue
        name = series.split("{", 1)[0].strip()
        try:
            value = float(rest)
        except ValueError:
            continue
        if value == value:  # not NaN
            values[name] = values.get(name, 0.0) + value
    return values


def member_figures(values: Mapping[str, float]) -> dict[str, float]:
    """The member's figures the soak reads (MEMBER_METRICS), those its page has."""
    return {key: values[name] for key, name in MEMBER_METRICS.items() if name in values}


@dataclasses.dataclass(frozen=True, slots=True)
class Counter:
    """A counter read from one process: a restart (another pid) starts it again from 0."""

    at_s: float
    pid: int
    value: float


def windows_rate(before: Mapping[str, Counter], now: Mapping[str, Counter]) -> float | None:
    """Windows per second over all members between two readings of their windows counters.
    A member restarted in between (another pid, or a counter that went down) counts what its
    new process did; a member read only once counts nothing. None: no interval to divide by."""
    spans = [now[m].at_s - before[m].at_s for m in now if m in before]
    if not spans or max(spans) <= 0:
        return None
    done = 0.0
    for member, reading in now.items():
        previous = before.get(member)
        if previous is None:
            continue
        restarted = previous.pid != reading.pid or reading.value < previous.value
        done += reading.value if restarted else reading.value - previous.value
    return done / max(spans)


@dataclasses.dataclass
class Sample:
    """One sampling round of the soak, `at_s` seconds after the load started."""

    at_s: float
    processes: dict[str, ProcessSample | None]
    members: dict[str, dict[str, float]]  # member -> member_figures
    lag_records: int | None = None  # the group's offset lag over every partition
    lag_s: float | None = None  # the oldest waiting chunk's age (the worst partition)
    audio_lag_s: float | None = None  # seconds of codec frames waiting, over every partition
    windows_per_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Sample:
        processes = {
            role: None if value is None else ProcessSample(**value)
            for role, value in raw["processes"].items()
        }
        fields = {k: raw.get(k) for k in ("lag_records", "lag_s", "audio_lag_s", "windows_per_s")}
        return cls(raw["at_s"], processes, dict(raw["members"]), **fields)


@dataclasses.dataclass(frozen=True, slots=True)
class LagPoint:
    """The group's lag at `at_s` (sampled more often than the processes, for its p99)."""

    at_s: float
    records: int | None
    lag_s: float | None
    audio_s: float | None


# What the lag exporter's page (`codeclog lag-exporter`, codeclog.lag.exporter) gives the soak
EXPORTER_LAG = {
    "records": "kafka_consumergroup_group_sum_lag",
    "lag_s": "kafka_consumergroup_group_max_lag_seconds",
    "audio_s": "codeclog_audio_lag_seconds",  # per partition: added up
}


def exporter_lag(at_s: float, values: Mapping[str, float] | None) -> LagPoint:
    """The group's lag as the exporter measured it last (codeclog.lag.measure): records over
    every partition, the worst partition's time lag, the audio seconds waiting over every
    partition. A figure the page lacks (a failed measurement drops the group's series) is
    None, and so is everything when the page could not be read."""
    got = {key: (values or {}).get(name) for key, name in EXPORTER_LAG.items()}
    records = got["records"]
    return LagPoint(at_s, None if records is None else int(records), got["lag_s"], got["audio_s"])


LISTENER_FIGURES = {
    "played": re.compile(r"(\d+) windows played"),
    "open_streams": re.compile(r"(\d+) streams open"),
    "later_copies": re.compile(r"(\d+) later copies"),
    "differed": re.compile(r"(\d+) differed"),
    "missing": re.compile(r"(\d+) missing"),
}


def listener_progress(text: str) -> dict[str, int]:
    """The figures of the newest progress line of a `codeclog listen` log (its stderr: lines
    rewritten with a carriage return); those it does not state are absent."""
    lines = [line for line in text.replace("\r", "\n").splitlines() if "[listen]" in line]
    if not lines:
        return {}
    figures = {}
    for name, pattern in LISTENER_FIGURES.items():
        found = pattern.search(lines[-1])
        if found is not None:
            figures[name] = int(found.group(1))
    return figures
