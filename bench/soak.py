"""A day in the field, compressed (issue 43): the whole pipeline under a steady real-time load
and a fault every few minutes, for an hour, sampled once a minute for what grows.

    python -m bench.soak --seed 7                         # 60 minutes (the lead's runs)
    python -m bench.soak --minutes 10 --seed 3            # the quick check
    python -m bench.soak --minutes 4 --sample-s 15 --json soak.json --plot soak.png

What runs: a faultable local 3-node cluster (RF 3, min ISR 2, every link through Toxiproxy;
fixed 512 MiB heaps, pre-touched, so a node's resident size shows what grows beside its heap),
two `codeclog vocode` members (tiny vocoder, one group), the synthetic duplex talker
(bench.soak_talker: `--streams` sessions per round, a round every `--round-s`, new request ids
each round, barge-ins, aborts and new epochs inside them), a speculative and a committed
`codeclog listen`, and `codeclog lag-exporter` on the group. One fault about every
`--fault-every` minutes, drawn by `--seed` from the fault matrix's process and network faults
(codeclog.devtools.fault_actions, network_faults: injected by the same functions).

Sampled every `--sample-s` (default 60 s) for each process (members, talker, listeners,
exporter, each node's JVM, Toxiproxy): resident size, open fds, threads (/proc); each member's
open streams and fold state (its Prometheus page); the group's lag in records, seconds and
audio seconds (from the lag exporter's page, codeclog.lag.measure, every `--lag-s`: a measuring
client of its own once aborted this process in librdkafka with the whole cluster down) and the
windows vocoded per second.

At the end, with the talker stopped and the group drained: the talker's lost records, `verify`
(the offline replay of the chunk topic: every window once, byte-identical), the independent
audit of the audio topic and the history checker (as after every fault of the matrix), and the
listeners' own findings. Then the tables and, last, the verdict line (docs/soak.md: what OK,
DRIFT and FAIL mean). Exit 0 for OK, 1 for DRIFT or FAIL, 2 when the soak could not run.
Everything it started is stopped at the end and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from codeclog.devtools.audit import audit
from codeclog.devtools.broker import BrokerSettings
from codeclog.devtools.cluster import LocalCluster
from codeclog.devtools.fault_actions import FAULTS, FaultContext, SkewedClock, with_nodes_up
from codeclog.devtools.faults import check_history, inject
from codeclog.devtools.host import parent_death_hook, pick_free_port
from codeclog.devtools.links import LinkUsageError
from codeclog.devtools.members import READY_LINE, Members, child_env, wait_group_drained
from codeclog.devtools.network_faults import NETWORK_FAULTS, faketime_env
from codeclog.devtools.soak_plan import PlannedFault, fault_plan
from codeclog.devtools.soak_samples import (
    Counter,
    LagPoint,
    Sample,
    exporter_lag,
    listener_progress,
    member_figures,
    metric_values,
    sample_process,
    windows_rate,
)
from codeclog.devtools.soak_verdict import (
    OK,
    Correctness,
    as_faults,
    growths,
    lag_table,
    process_table,
    quarter_p99,
    time_table,
    verdict,
    verdict_line,
)
from codeclog.devtools.stack import write_topics_file
from codeclog.devtools.stats import percentile
from codeclog.kafka.topics import create_topics
from codeclog.topics_config import TopicsConfig

STREAMS = 4  # sessions per round: what the tiny vocoder keeps up with here (BENCHMARKS.md)
ROUND_S = 10.0
PARTITIONS = 4
MEMBERS = ("a", "b")
MEMBER_READY_S = 300.0
DRAIN_S = 600.0
TALKER_CLOSE_S = 240.0
STOP_S = 60.0
SCRAPE_TIMEOUT_S = 2.0
LISTENERS = ("speculative", "committed")
TOOLING = frozenset({"toxiproxy"})  # sampled, never judged: no part of a deployment


class SoakError(Exception):
    """The soak could not run (no Toxiproxy, a member that never became ready, ...)."""


@dataclasses.dataclass
class Processes:
    """Everything the soak starts besides the cluster and the members, by role."""

    logs: Path
    running: dict[str, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)

    def start(self, role: str, command: list[str], env: dict[str, str] | None = None) -> None:
        """`command`, its output in logs/ROLE.out and .err; SIGTERMed if the soak dies."""
        with (
            (self.logs / f"{role}.out").open("wb") as out,
            (self.logs / f"{role}.err").open("wb") as err,
        ):
            self.running[role] = subprocess.Popen(
                command,
                stdout=out,
                stderr=err,
                env={**child_env(), **(env or {})},
                preexec_fn=parent_death_hook(),
            )

    def stop(self, role: str, sig: int, timeout_s: float) -> int | None:
        """`sig`, then SIGKILL past `timeout_s`; the exit code (None: never started)."""
        process = self.running.get(role)
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(sig)
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()

    def text(self, role: str, stream: str = "err") -> str:
        path = self.logs / f"{role}.{stream}"
        return path.read_text(errors="replace") if path.exists() else ""


class FileSkewedClock(SkewedClock):
    """The talker's clock when it runs in a process of its own: the clock-skew fault's offset
    goes to the file the talker reads it from (bench.soak_talker --clock-file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset_ms = 0
        super().__init__()

    @property
    def offset_ms(self) -> int:
        return self._offset_ms

    @offset_ms.setter
    def offset_ms(self, value: int) -> None:
        self._offset_ms = value
        self.path.write_text(f"{value // 1000:+d}\n")


@dataclasses.dataclass
class FaultRecord:
    fault: str
    at_s: float
    end_s: float
    what: str
    error: str = ""


class Sampler(threading.Thread):
    """Samples while the main thread injects faults: the group's lag from the exporter's page
    every `--lag-s`, every process and member every `--sample-s`, until the run's end."""

    def __init__(self, soak: Soak) -> None:
        super().__init__(daemon=True)
        self.soak = soak
        self.points: list[LagPoint] = []
        self.halt = threading.Event()

    def run(self) -> None:
        soak = self.soak
        next_lag = next_sample = soak.t0
        while not self.halt.is_set():
            now = time.monotonic()
            if now >= next_lag:
                values = scrape(soak.exporter_port)
                self.points.append(exporter_lag(round(now - soak.t0, 1), values))
                next_lag += soak.args.lag_s
            if now >= next_sample:
                soak.sample(self.points[-1] if self.points else None)
                next_sample += soak.args.sample_s
                if next_sample - soak.t0 > soak.duration_s + 1:
                    return
            self.halt.wait(max(0.0, min(next_lag, next_sample) - time.monotonic()))


def _quiet_kafka_logs() -> None:
    """librdkafka's lines about the nodes the faults take down are expected: not on stderr."""
    kafka_log = logging.getLogger("codeclog.kafka")
    kafka_log.addHandler(logging.NullHandler())
    kafka_log.propagate = False


def start_cluster(data_dir: Path) -> LocalCluster:
    settings = BrokerSettings(
        heap_min_mb=512,
        heap_max_mb=512,
        start_timeout_s=240,
        die_with_parent=True,
        extra_jvm_args=("-XX:TieredStopAtLevel=1", "-XX:+AlwaysPreTouch"),
    )
    cluster = LocalCluster(data_dir, 3, settings, faultable=True)
    cluster.start()
    return cluster


def soak_context(cluster: LocalCluster, logs: Path, talker_skew: Path | None) -> FaultContext:
    """The run's topics, group and members, as the fault matrix's FaultContext."""
    run = uuid.uuid4().hex[:6]
    topics = TopicsConfig(
        chunks=f"soak-{run}-chunks",
        audio=f"soak-{run}-audio",
        dlq=f"soak-{run}-dlq",
        progress=f"soak-{run}-progress",
        partitions=PARTITIONS,
    )
    client = {"bootstrap.servers": cluster.bootstrap}
    create_topics(client, topics)
    members = Members(logs, die_with_parent=True)
    ctx = FaultContext(
        cluster, client, topics, write_topics_file(topics, logs), f"soak-{run}", members
    )
    layout = cluster.layout()
    ctx.member_client = {"bootstrap.servers": layout.link_bootstrap("member")}
    ctx.talker_client = {"bootstrap.servers": layout.link_bootstrap("talker")}
    if talker_skew is not None:  # clock-skew: member a under libfaketime from its start
        ctx.member_env = faketime_env(logs)
        ctx.talker_clock = FileSkewedClock(talker_skew)
    return ctx


def codeclog_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "codeclog.cli", *args]


def scrape(port: int) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT_S
        ) as page:
            return metric_values(page.read().decode())
    except OSError:
        return None


class Soak:
    """One run: what it started, what it sampled, and how it ends."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.duration_s = args.minutes * 60.0
        self.cluster: LocalCluster | None = None
        self.ctx: FaultContext | None = None
        self.others = Processes(self.logs)
        self.ports = {name: pick_free_port() for name in MEMBERS}
        self.samples: list[Sample] = []
        self.counters: dict[str, Counter] = {}
        self.failures: list[str] = []
        self.sampler = Sampler(self)
        self.plan: list[PlannedFault] = []
        self.done: list[FaultRecord] = []
        self.rng = random.Random(args.seed * 7919 + 1)  # what the faults draw (hold times, ...)
        self.t0 = time.monotonic()
        self.exporter_port = pick_free_port()
        self.faults = [f for f in (*FAULTS, *NETWORK_FAULTS) if f in set(args.faults)]
        skew = "clock-skew" in self.faults and faketime_env(self.logs) != {}
        if "clock-skew" in self.faults and not skew:
            self.faults.remove("clock-skew")  # no libfaketime here
        self.talker_skew = self.logs / "talker-faketime" if skew else None

    # -- start ------------------------------------------------------------------------------

    def start(self) -> None:
        say(f"starting a faultable 3-node cluster in {self.workdir}")
        self.cluster = start_cluster(self.workdir / "cluster")
        ctx = self.ctx = soak_context(self.cluster, self.logs, self.talker_skew)
        for name in MEMBERS:
            ctx.member_args[name] = ("--metrics-port", str(self.ports[name]))
            ctx.start_member(name)
        say(f"members {', '.join(MEMBERS)} loading the tiny vocoder (group {ctx.group})")
        for name in MEMBERS:
            ctx.members.wait_for_log(ctx.members.latest[name], READY_LINE, MEMBER_READY_S)
        self._start_readers()
        self._start_talker()
        self.t0 = time.monotonic()
        every_s = self.args.fault_every * 60
        self.plan = fault_plan(self.duration_s, every_s, self.faults, random.Random(self.args.seed))
        say(
            f"load on: {self.args.streams} streams, a round every {self.args.round_s:g} s; "
            f"{len(self.plan)} faults planned: "
            + ", ".join(f"{p.fault} at {p.at_s / 60:.1f} min" for p in self.plan)
        )
        self.sampler.start()

    def _start_readers(self) -> None:
        ctx = self.ctx
        assert ctx is not None
        where = ["--bootstrap", ctx.client["bootstrap.servers"]]
        where += ["--topics-config", str(ctx.topics_file)]
        for isolation in LISTENERS:
            self.others.start(
                f"listener-{isolation}",
                codeclog_command("listen", *where, "--isolation", isolation),
            )
        self.others.start(
            "exporter",
            codeclog_command(
                "lag-exporter",
                *where,
                "--port",
                str(self.exporter_port),
                "--address",
                "127.0.0.1",
                "--group",
                ctx.group,
                "--interval",
                f"{self.args.lag_s:g}",
            ),
        )

    def _start_talker(self) -> None:
        ctx = self.ctx
        assert ctx is not None
        command = [sys.executable, "-m", "bench.soak_talker"]
        command += ["--bootstrap", ctx.talker_client["bootstrap.servers"]]
        command += ["--topic", ctx.topics.chunks, "--sessions", str(self.args.streams)]
        command += ["--round-s", str(self.args.round_s), "--seed", str(self.args.seed)]
        command += ["--close-s", str(TALKER_CLOSE_S)]
        if self.talker_skew is not None:
            command += ["--clock-file", str(self.talker_skew)]
        self.others.start("talker", command)

    # -- run --------------------------------------------------------------------------------

    def run(self) -> None:
        """The faults, each at its time, in this (the main) thread: a node a fault restarts dies
        with the thread that started it (PR_SET_PDEATHSIG), so that is the soak's own; between
        faults, the members are looked after."""
        left = list(self.plan)
        while (elapsed := time.monotonic() - self.t0) < self.duration_s:
            if left and elapsed >= left[0].at_s:
                self.done.append(self.inject(left.pop(0).fault))
                continue
            self.supervise()
            time.sleep(1.0)
        self.sampler.join(self.args.sample_s + 60)

    def inject(self, fault: str) -> FaultRecord:
        ctx = self.ctx
        assert ctx is not None
        started = time.monotonic() - self.t0
        say(f"fault {fault} at {started / 60:.1f} min")
        error = ""
        try:
            inject(ctx, fault, self.rng)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        try:
            with_nodes_up(ctx.cluster)
        except Exception as exc:
            error = error or f"nodes not up again: {type(exc).__name__}: {exc}"
        what = "; ".join(ctx.notes) or "(not injected)"
        ctx.notes.clear()
        ended = round(time.monotonic() - self.t0, 1)
        say(f"fault {fault}: {what}{'; ' + error if error else ''}")
        return FaultRecord(fault, round(started, 1), ended, what, error)

    @property
    def next_fault(self) -> PlannedFault | None:
        left = self.plan[len(self.done) :]
        return left[0] if left else None

    def pids(self) -> dict[str, int | None]:
        ctx, cluster = self.ctx, self.cluster
        assert ctx is not None and cluster is not None
        pids: dict[str, int | None] = {}
        for name in MEMBERS:
            process = ctx.members.latest.get(name)
            pids[f"member-{name}"] = process.pid if process and process.poll() is None else None
        for role, process in self.others.running.items():
            pids[role] = process.pid if process.poll() is None else None
        for node in cluster.layout().node_ids:
            pids[f"node-{node}"] = cluster.node(node).running_pid()
        links = cluster.links_status()
        pids["toxiproxy"] = links.pid if links is not None else None
        return pids

    def sample(self, lag: LagPoint | None) -> None:
        at = time.monotonic() - self.t0
        processes = {role: sample_process(pid) for role, pid in self.pids().items()}
        members: dict[str, dict[str, float]] = {}
        counters: dict[str, Counter] = {}
        for name in MEMBERS:
            values = scrape(self.ports[name])
            process = processes.get(f"member-{name}")
            if values is None or process is None:
                continue
            members[name] = member_figures(values)
            if "windows" in members[name]:
                counters[name] = Counter(at, process.pid, members[name]["windows"])
        last_lag = lag or LagPoint(at, None, None, None)
        sample = Sample(
            round(at, 1),
            processes,
            members,
            last_lag.records,
            last_lag.lag_s,
            last_lag.audio_s,
            windows_rate(self.counters, counters),
        )
        self.counters = counters or self.counters
        self.samples.append(sample)
        self.progress(sample)

    def progress(self, s: Sample) -> None:
        nxt = self.next_fault
        upcoming = f"next {nxt.fault} at {nxt.at_s / 60:.1f} min" if nxt else "no more"
        rss = " ".join(
            f"{_short(role)} {p.rss_bytes / 1e6:.0f}"
            for role, p in s.processes.items()
            if p is not None
        )
        present = [p for p in s.processes.values() if p is not None]
        say(
            f"{s.at_s / 60:5.1f}/{self.args.minutes:g} min | faults {len(self.done)} "
            f"({upcoming}) | lag {_fig(s.lag_records)} rec {_fig(s.lag_s, 1)} s "
            f"{_fig(s.audio_lag_s, 1)} s audio | {_fig(s.windows_per_s, 1)} windows/s | RSS MB "
            f"{rss} | fds {sum(p.fds for p in present)} | threads {sum(p.threads for p in present)}"
        )

    def supervise(self) -> None:
        """A member that exited on its own is a finding, and is started again (as a supervisor
        would); so is any other process that exited (it is not started again). Between faults
        only: a fault restarts its own member."""
        ctx = self.ctx
        assert ctx is not None
        for name in MEMBERS:
            process = ctx.members.latest[name]
            if process.poll() is not None and process.returncode != -signal.SIGKILL:
                at = (time.monotonic() - self.t0) / 60
                self.failures.append(f"member {name} exited {process.returncode} at {at:.1f} min")
                say(f"member {name} exited {process.returncode}: started again")
                ctx.start_member(name)
        for role, process in self.others.running.items():
            if process.poll() is not None and not any(role in f for f in self.failures):
                self.failures.append(f"{role} exited {process.returncode}")
                say(f"{role} exited {process.returncode} ({self.others.logs}/{role}.err)")

    # -- end --------------------------------------------------------------------------------

    def wind_down(self) -> dict[str, Any]:
        """Stop the load, wait for the group to drain, stop everything but the cluster; what
        the talker and the listeners said."""
        ctx = self.ctx
        assert ctx is not None
        self.sampler.halt.set()
        say("stopping the talker (it finishes its round and delivers what it holds)")
        self.others.stop("talker", signal.SIGTERM, TALKER_CLOSE_S + 3 * self.args.round_s)
        talker = _last_json(self.others.text("talker", "out"))
        say("waiting for the group to commit everything")
        why = wait_group_drained(ctx.client, ctx.group, ctx.topics.chunks, DRAIN_S)
        if why:
            self.failures.append(why)
        for name in MEMBERS:  # a member that died in the last moments
            if ctx.members.latest[name].poll() not in (None, -signal.SIGKILL, 0):
                self.failures.append(f"member {name} exited {ctx.members.latest[name].returncode}")
        ctx.members.stop_all(STOP_S)
        self.failures += [e for e in ctx.members.exits if "SIGKILLed" not in e]
        listeners = {}
        for isolation in LISTENERS:
            role = f"listener-{isolation}"
            code = self.others.stop(role, signal.SIGTERM, STOP_S)
            listeners[role] = {"exit": code, **listener_progress(self.others.text(role))}
            if code not in (0, None):
                self.failures.append(f"{role} exited {code}")
        self.others.stop("exporter", signal.SIGTERM, STOP_S)
        return {"talker": talker, "listeners": listeners}

    def checks(self, ended: dict[str, Any]) -> tuple[Correctness, dict[str, Any]]:
        """verify, the audit and the history checker on what the run wrote."""
        from codeclog.consumers.readers.verify import verify
        from codeclog.vocoder.engine import Code2WavEngine

        ctx = self.ctx
        assert ctx is not None
        say("verify: replaying the chunk topic offline (the tiny vocoder)")
        report = verify(ctx.client, ctx.topics, Code2WavEngine.from_spec("tiny"))
        say("the audit and the history checker")
        checked = audit(ctx.client, ctx.topics.audio, ctx.topics.dlq)
        history, history_logs = check_history(ctx)
        talker = ended["talker"]
        correct = Correctness(
            lost=int(talker.get("failed", 0)) + len(report.missing),
            duplicated=len(report.duplicated) + int(checked.summary()["duplicated"]),
            anomalies={
                **{kind: len(items) for kind, items in history.items()},
                "mismatched": len(report.mismatched),
                "unexpected": len(report.unexpected),
                "corrupt": len(report.corrupt) + int(checked.summary()["corrupt"]),
                "dead_letters": checked.dead_letters,
                "listener_differed": sum(
                    int(v.get("differed", 0)) for v in ended["listeners"].values()
                ),
            },
            failures=list(self.failures),
        )
        if not talker.get("closed"):
            correct.failures.append("the talker did not report its close")
        elif talker.get("error"):
            correct.failures.append(f"talker: {talker['error']}")
        if not checked.ok and not any(correct.anomalies.values()) and not correct.duplicated:
            correct.failures.append(f"audit: {checked.summary()}")
        correct.failures += [f"fault {f.fault}: {f.error}" for f in self.done if f.error]
        details = {
            "verify": {
                "ok": report.ok,
                "expected_windows": report.expected_windows,
                "actual_windows": report.actual_windows,
                "requests": report.requests,
                "missing": len(report.missing),
                "duplicated": len(report.duplicated),
                "dead_letters": report.dead_letters,
            },
            "audit": checked.summary(),
            "history": {kind: items[:3] for kind, items in history.items()},
            "history_logs": history_logs,
            **ended,
        }
        return correct, details

    def stop_all(self) -> None:
        """Whatever still runs, at once (the end, an error, Ctrl-C)."""
        self.sampler.halt.set()
        if self.ctx is not None:
            self.ctx.members.kill_all()
        for role in list(self.others.running):
            self.others.stop(role, signal.SIGKILL, 10)
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.stop()


def filling(role: str) -> float:
    """Seconds a role's working set fills by design: a listener remembers each ended stream
    for ListenerConfig.ended_ttl_s (docs/listening.md)."""
    from codeclog.consumers.readers.deliveries import ListenerConfig

    return ListenerConfig().ended_ttl_s if role.startswith("listener-") else 0.0


def _short(role: str) -> str:
    return role.replace("member-", "").replace("listener-", "").replace("node-", "n")


def _fig(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    return {}


def say(text: str) -> None:
    print(f"[soak] {text}", flush=True)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the soak like Ctrl-C: everything it started is stopped."""

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def report(
    soak: Soak, correct: Correctness, details: dict[str, Any], took_s: float
) -> tuple[str, dict[str, Any]]:
    """Print the tables and the verdict line (last); the JSON document."""
    faults = soak.done
    windows = as_faults([dataclasses.asdict(f) for f in faults])
    points = soak.sampler.points
    quarters = quarter_p99(points, soak.duration_s, windows)
    whole = percentile([p.lag_s for p in points if p.lag_s is not None], 99)
    found = growths(soak.samples, soak.duration_s, lambda role: role not in TOOLING, filling)
    word, reasons = verdict(correct, found, quarters)
    print()
    print("| fault | at min | what happened | error |\n|---|---:|---|---|")
    for f in faults:
        print(f"| {f.fault} | {f.at_s / 60:.1f} | {f.what} | {f.error or '-'} |")
    print()
    print(time_table(soak.samples, MEMBERS))
    print()
    print(process_table(soak.samples, found))
    print()
    print(lag_table(quarters, whole))
    print()
    v = details["verify"]
    print(
        f"verify: {v['expected_windows']} windows expected of {v['requests']} requests, "
        f"{v['actual_windows']} on the audio topic; audit {details['audit']}; "
        f"history logs: {details['history_logs']}"
    )
    print(f"listeners: {json.dumps(details['listeners'])}")
    print(f"talker: {json.dumps(details['talker'])}")
    if reasons:
        print(f"{word}: " + "; ".join(reasons))
    load = os.getloadavg()
    print(
        f"took {took_s / 60:.1f} min; load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
        f"on {os.cpu_count()} cores; command: python -m bench.soak {' '.join(sys.argv[1:])}"
    )
    line = verdict_line(soak.args.minutes, len(faults), correct, found, soak.samples, whole, word)
    print(line)
    document = {
        "command": ["python", "-m", "bench.soak", *sys.argv[1:]],
        "settings": {k: v for k, v in vars(soak.args).items() if k not in ("json", "plot")},
        "faults": [dataclasses.asdict(f) for f in faults],
        "samples": [s.to_json() for s in soak.samples],
        "lag": [dataclasses.asdict(p) for p in points],
        "growth": [dataclasses.asdict(g) for g in found],
        "lag_p99_by_quarter": quarters,
        "lag_p99": whole,
        "correctness": dataclasses.asdict(correct),
        "checks": details,
        "verdict": word,
        "reasons": reasons,
        "line": line,
    }
    return word, document


def plot(document: dict[str, Any], path: Path) -> None:
    """RSS per process and the group's lag over time, one above the other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = [Sample.from_json(s) for s in document["samples"]]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    roles = list(dict.fromkeys(role for s in samples for role in s.processes))
    for role in roles:
        points = [(s.at_s / 60, p.rss_bytes / 1e6) for s in samples if (p := s.processes[role])]
        if points:
            top.plot(*zip(*points, strict=True), marker=".", label=role)
    top.set_yscale("log")  # the members' GB and the listeners' tens of MB, both readable
    top.set_ylabel("resident MB (log)")
    top.legend(fontsize="small", ncol=3)
    lag = [(p["at_s"] / 60, p["lag_s"]) for p in document["lag"] if p["lag_s"] is not None]
    if lag:
        bottom.plot(
            *zip(*lag, strict=True), ".", markersize=3, label="time lag s (worst partition)"
        )
    for fault in document["faults"]:
        for axis in (top, bottom):
            axis.axvspan(fault["at_s"] / 60, fault["end_s"] / 60, color="red", alpha=0.1)
        bottom.annotate(fault["fault"], (fault["at_s"] / 60, 0), fontsize="x-small", rotation=90)
    bottom.set_ylabel("lag s")
    bottom.set_xlabel("minutes (faults shaded)")
    bottom.legend(fontsize="small")
    figure.suptitle(document["line"], fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    every = (*FAULTS, *NETWORK_FAULTS)
    parser.add_argument(
        "--minutes", type=float, default=60.0, help="length of the load (default 60)"
    )
    parser.add_argument("--seed", type=int, default=7, help="the faults, their moments, the talk")
    parser.add_argument(
        "--streams", type=int, default=STREAMS, help=f"sessions per round (default {STREAMS})"
    )
    parser.add_argument(
        "--round-s", type=float, default=ROUND_S, help="seconds of a round (default 10)"
    )
    parser.add_argument(
        "--fault-every",
        type=float,
        default=3.5,
        metavar="MIN",
        help="one fault about every MIN minutes (default 3.5; 0: none)",
    )
    parser.add_argument(
        "--faults",
        nargs="+",
        choices=every,
        default=list(every),
        metavar="FAULT",
        help="the faults to draw from (default: all 14)",
    )
    parser.add_argument(
        "--sample-s", type=float, default=60.0, help="seconds between samples (default 60)"
    )
    parser.add_argument(
        "--lag-s", type=float, default=5.0, help="seconds between lag measurements (default 5)"
    )
    parser.add_argument("--json", type=Path, help="write the samples and the findings here")
    parser.add_argument("--plot", type=Path, help="a PNG of RSS and lag over time per process")
    parser.add_argument(
        "--keep-logs", type=Path, metavar="DIR", help="run in DIR and keep the logs"
    )
    args = parser.parse_args()
    if args.minutes <= 0 or args.streams < 1 or args.sample_s <= 0 or args.lag_s <= 0:
        parser.error("--minutes, --streams, --sample-s and --lag-s must be positive")
    return args


def main() -> int:
    args = parse_args()
    _quiet_kafka_logs()
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        workdir = args.keep_logs or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        soak = Soak(args, workdir)
        try:
            with sigterm_as_interrupt():
                soak.start()
                soak.run()
                ended = soak.wind_down()
                correct, details = soak.checks(ended)
        except KeyboardInterrupt:
            say("interrupted: stopping everything")
            soak.stop_all()
            return 130
        except (LinkUsageError, SoakError) as exc:
            print(f"bench.soak: {exc}", file=sys.stderr)
            soak.stop_all()
            return 2
        except BaseException:
            soak.stop_all()
            raise
        soak.stop_all()
        word, document = report(soak, correct, details, time.monotonic() - started)
    if args.json:
        args.json.write_text(json.dumps(document, indent=1, default=str))
    if args.plot:
        plot(document, args.plot)
    return 0 if word == OK else 1


if __name__ == "__main__":
    sys.exit(main())
