"""The shipped monitoring stack run for real on this machine: Debian's `prometheus` and
`prometheus-alertmanager`, `codeclog lag-exporter`, the talker and the on-call receiver of
deploy/alertmanager, each a process of its own (tests/deploy/test_alerting_end_to_end.py,
tests/deploy/test_exporter_soak.py).

The configs are the shipped files with only their host names mapped to 127.0.0.1 ports
(`mapped`: a rewrite that checks it changed nothing else).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import pytest

from codeclog.devtools.host import parent_death_hook, pick_free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS = shutil.which("prometheus")
# Debian names the binary prometheus-alertmanager; upstream tarballs name it alertmanager
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus not installed (Debian: apt-get install prometheus; bootstrap.sh does it)",
)
needs_alertmanager = pytest.mark.skipif(
    ALERTMANAGER is None,
    reason="alertmanager not installed (Debian: apt-get install prometheus-alertmanager; "
    "bootstrap.sh does it)",
)
START_TIMEOUT_S = 60.0  # a process is up and answering (generous: 2 shared cores)


def mapped(text: str, hosts: Mapping[str, str]) -> str:
    """`text` with each shipped "host:port" replaced by its local address, and nothing else:
    every shipped name must occur, and mapping back must give `text` again."""
    out = text
    for shipped, local in hosts.items():
        assert shipped in text, f"{shipped} is not in the shipped config"
        out = out.replace(shipped, local)
    back = out
    for shipped, local in hosts.items():
        back = back.replace(local, shipped)
    assert back == text, "the host mapping changed more than host names"
    return out


def local(port: int) -> str:
    return f"127.0.0.1:{port}"


class Processes:
    """Processes started for one test, each logging to a file under `logs`; all stopped at
    the end (SIGTERM, then SIGKILL), and by the kernel if the test process dies."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self._running: dict[str, subprocess.Popen[bytes]] = {}
        self._files: list[IO[bytes]] = []

    def start(self, name: str, argv: Sequence[str], **env: str) -> subprocess.Popen[bytes]:
        out = (self.logs / f"{name}.out").open("wb")
        err = (self.logs / f"{name}.err").open("wb")
        self._files += [out, err]
        process = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=err,
            cwd=self.logs,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            preexec_fn=parent_death_hook(),
        )
        self._running[name] = process
        return process

    def process(self, name: str) -> subprocess.Popen[bytes]:
        return self._running[name]

    def output(self, name: str, stream: str = "err") -> str:
        return (self.logs / f"{name}.{stream}").read_text(errors="replace")

    def tails(self) -> str:
        """The end of every log, for a failure message."""
        parts = []
        for path in sorted(self.logs.glob("*.out")) + sorted(self.logs.glob("*.err")):
            text = path.read_text(errors="replace")[-1500:]
            if text.strip():
                parts.append(f"--- {path.name} ---\n{text}")
        return "\n".join(parts)

    def stop(self) -> None:
        for process in self._running.values():
            if process.poll() is None:
                process.terminate()
        for process in self._running.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for file in self._files:
            file.close()


@contextlib.contextmanager
def processes(logs: Path) -> Iterator[Processes]:
    running = Processes(logs)
    try:
        yield running
    finally:
        running.stop()


def wait_for(
    what: str, check: Callable[[], Any], timeout_s: float, diagnostics: Callable[[], str]
) -> Any:
    """`check()`'s first truthy value, polled every 0.2 s; fails with `diagnostics()`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"{what}: not within {timeout_s:g} s\n{diagnostics()}")


def stays_alive(process: subprocess.Popen[bytes], seconds: float) -> bool:
    """Whether `process` is still running after `seconds` (returns as soon as it exits)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        time.sleep(0.5)
    return process.poll() is None


def http_json(port: int, path: str, **params: str) -> Any:
    """GET http://127.0.0.1:port/path?params as JSON; None when nothing answers yet."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    try:
        with urllib.request.urlopen(f"http://{local(port)}{path}{query}", timeout=5) as answer:
            return json.load(answer)
    except OSError:
        return None


def codeclog(*args: str) -> tuple[str, ...]:
    """The argv of `codeclog ARGS` from this checkout."""
    return (sys.executable, "-m", "codeclog.cli", *args)


def start_exporter(
    running: Processes, bootstrap: str, topic: str, group: str, interval_s: float
) -> int:
    """`codeclog lag-exporter` on a free port; returns the port once it serves."""
    argv = codeclog(
        *("lag-exporter", "--bootstrap", bootstrap, "--topic", topic, "--group", group),
        *("--port", "0", "--address", "127.0.0.1", "--interval", str(interval_s)),
    )
    running.start("exporter", argv, PYTHONFAULTHANDLER="1")
    serving = re.compile(r"serving http://127\.0\.0\.1:(\d+)/metrics")

    def port() -> int | None:
        found = serving.search(running.output("exporter"))
        return int(found[1]) if found else None

    return int(wait_for("the exporter serves /metrics", port, START_TIMEOUT_S, running.tails))


def start_oncall(running: Processes) -> int:
    """The shipped on-call receiver (deploy/alertmanager/oncall_webhook.py) on a free port."""
    script = DEPLOY / "alertmanager" / "oncall_webhook.py"
    running.start("oncall", [sys.executable, str(script), "--port", "0", "--address", "127.0.0.1"])
    listening = re.compile(r"listening on 127\.0\.0\.1:(\d+)")

    def port() -> int | None:
        found = listening.search(running.output("oncall"))
        return int(found[1]) if found else None

    return int(wait_for("the on-call receiver listens", port, START_TIMEOUT_S, running.tails))


def pages(running: Processes) -> list[dict[str, Any]]:
    """The notifications the on-call receiver printed so far (one JSON object per line; a last
    line still being written, with no newline yet, waits for the next look)."""
    lines = running.output("oncall", "out").split("\n")[:-1]
    return [json.loads(line) for line in lines if line.startswith("{")]


def start_alertmanager(running: Processes, workdir: Path, hosts: Mapping[str, str]) -> int:
    """Alertmanager with the shipped alertmanager.yml, `hosts` mapped; returns its port."""
    assert ALERTMANAGER is not None
    port = pick_free_port()
    config = workdir / "alertmanager.yml"
    shipped = (DEPLOY / "alertmanager" / "alertmanager.yml").read_text()
    config.write_text(mapped(shipped, hosts))
    running.start(
        "alertmanager",
        [
            ALERTMANAGER,
            f"--config.file={config}",
            f"--storage.path={workdir / 'alertmanager-data'}",
            f"--web.listen-address={local(port)}",
            "--cluster.listen-address=",  # one instance: no gossip port
        ],
    )
    wait_for("Alertmanager is ready", lambda: _ready(port), START_TIMEOUT_S, running.tails)
    return port


def start_prometheus(running: Processes, workdir: Path, config_text: str) -> int:
    """Prometheus with this prometheus.yml and the shipped alerts.yml; returns its port."""
    assert PROMETHEUS is not None
    port = pick_free_port()
    (workdir / "prometheus.yml").write_text(config_text)
    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", workdir / "alerts.yml")  # unchanged
    running.start(
        "prometheus",
        [
            PROMETHEUS,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'prometheus-data'}",
            f"--web.listen-address={local(port)}",
        ],
    )
    wait_for("Prometheus is ready", lambda: _ready(port), START_TIMEOUT_S, running.tails)
    return port


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{local(port)}/-/ready", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def shipped_prometheus(hosts: Mapping[str, str]) -> str:
    return mapped((DEPLOY / "prometheus" / "prometheus.yml").read_text(), hosts)


def target_health(prometheus_port: int, job: str) -> str | None:
    """The health of `job`'s target as Prometheus last scraped it ("up", "down", "unknown")."""
    answer = http_json(prometheus_port, "/api/v1/targets")
    if not answer:
        return None
    for target in answer["data"]["activeTargets"]:
        if target["labels"].get("job") == job:
            return str(target["health"])
    return None


def query(prometheus_port: int, promql: str) -> list[dict[str, Any]]:
    """An instant query's result vector ([] when empty or not answered)."""
    answer = http_json(prometheus_port, "/api/v1/query", query=promql)
    return list(answer["data"]["result"]) if answer else []


def first_record_ms(bootstrap: str, topic: str, partitions: int) -> int:
    """The earliest record timestamp of `topic` (the talker's first chunk)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        starts = {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                starts[p] = low
        assert starts, f"no record on {topic}"
        consumer.assign([TopicPartition(topic, p, offset) for p, offset in starts.items()])
        firsts: dict[int, int] = {}
        deadline = time.monotonic() + 30
        while len(firsts) < len(starts) and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=100, timeout=0.5):
                if message.error() is None:
                    firsts.setdefault(message.partition(), message.timestamp()[1])
        assert len(firsts) == len(starts), f"could not read the first records of {topic}"
        return min(firsts.values())
    finally:
        consumer.close()


def start_talker(running: Processes, bootstrap: str, topic: str, seconds: float) -> None:
    """The synthetic talker (`codeclog talk --realtime`): 4 live sessions publishing."""
    argv = codeclog(
        *("talk", "--bootstrap", bootstrap, "--topic", topic, "--sessions", "4"),
        *("--seconds", str(seconds), "--realtime", "--quiet"),
    )
    running.start("talker", argv)
