"""`codeclog vocode` members as separate processes (so they can be SIGKILLed), each logging
into its own file: started, waited for (a log line), stopped (SIGTERM, SIGKILL past a
timeout), killed, and stopped once their group committed everything."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import codeclog
from codeclog.devtools.host import parent_death_hook
from codeclog.errors import CodeclogError
from codeclog.lag.drain import undrained, wait_drained

READY_LINE = "state restored in"  # a member logs it once it holds its partitions
TAIL_CHARS = 3000  # of each log, in `Members.tail`


class MemberError(CodeclogError):
    """A member exited, or did not log what was waited for in time (its log: `log`)."""

    def __init__(self, message: str, log: Path) -> None:
        super().__init__(message)
        self.log = log


def child_env() -> dict[str, str]:
    """This environment, unbuffered, with the folder of the codeclog this process runs first
    on PYTHONPATH (a checkout that is not installed runs its own members)."""
    here = str(Path(codeclog.__file__).resolve().parents[1])
    python_path = os.pathsep.join(filter(None, (here, os.environ.get("PYTHONPATH"))))
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": python_path}


@dataclasses.dataclass
class Members:
    """The `codeclog vocode` processes of one run; their logs go to `logs`."""

    logs: Path
    processes: list[subprocess.Popen[bytes]] = dataclasses.field(default_factory=list)
    log_of: dict[int, Path] = dataclasses.field(default_factory=dict)  # pid -> log file
    latest: dict[str, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)
    name_of: dict[int, str] = dataclasses.field(default_factory=dict)  # pid -> instance id
    exits: list[str] = dataclasses.field(default_factory=list)  # what stop/kill saw
    # SIGTERM from the kernel when the thread that started a member dies (the soak: a harness
    # that dies leaves no member behind)
    die_with_parent: bool = False

    def start(
        self,
        instance: str,
        *args: str,
        log: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """`codeclog vocode --instance-id INSTANCE ARGS`, stdout and stderr into `log` (default
        vocode-INSTANCE-N.log in `logs`, N counting this run's members); `env` adds to its
        environment (e.g. libfaketime's, for the clock-skew fault)."""
        path = log or self.logs / f"vocode-{instance}-{len(self.processes)}.log"
        command = [sys.executable, "-m", "codeclog.cli", "vocode", "--instance-id", instance]
        with path.open("wb") as out:
            process = subprocess.Popen(
                [*command, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**child_env(), **(env or {})},
                preexec_fn=parent_death_hook() if self.die_with_parent else None,
            )
        self.processes.append(process)
        self.log_of[process.pid] = path
        self.latest[instance] = process
        self.name_of[process.pid] = instance
        return process

    def log_text(self, process: subprocess.Popen[bytes]) -> str:
        return self.log_of[process.pid].read_text(errors="replace")

    def wait_for_log(self, process: subprocess.Popen[bytes], text: str, timeout_s: float) -> None:
        """Until the member logged `text` (READY_LINE: it holds its partitions); MemberError
        when it exits first or `timeout_s` passes."""
        path = self.log_of[process.pid]
        started = time.monotonic()
        while text not in self.log_text(process):
            what = f"`codeclog vocode` ({self._name(process)})"
            if process.poll() is not None:
                raise MemberError(f"{what} exited with {process.returncode}; see {path}", path)
            if time.monotonic() - started > timeout_s:
                raise MemberError(
                    f"{what} logged no {text!r} in {timeout_s:.0f} s; see {path}", path
                )
            time.sleep(0.2)

    def stop(self, process: subprocess.Popen[bytes], timeout_s: float) -> int:
        """SIGTERM, then SIGKILL if it has not exited within `timeout_s`; its exit code."""
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.exits.append(f"{self._name(process)} did not stop on SIGTERM")
            process.kill()
            return process.wait()

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL, waited for."""
        process.send_signal(signal.SIGKILL)
        process.wait()
        self.exits.append(f"{self._name(process)} SIGKILLed")

    def stop_all(self, timeout_s: float) -> None:
        """SIGTERM every running member at once, then `stop` each; exits other than 0 (or a
        SIGKILL this run sent) go to `exits`."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            code = self.stop(process, timeout_s)
            if code not in (0, -signal.SIGKILL):
                self.exits.append(f"{self._name(process)} exited {code}")

    def kill_all(self) -> None:
        """SIGKILL every member that still runs (a test's teardown)."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()

    def crashed(self) -> list[str]:
        """The members that exited on their own with neither 0 nor a SIGKILL."""
        return [
            f"{self._name(p)} exited {p.returncode}"
            for p in self.processes
            if p.poll() is not None and p.returncode not in (0, -signal.SIGKILL)
        ]

    def tail(self) -> str:
        """The end of every member's log, in start order."""
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-TAIL_CHARS:]}"
            for path in self.log_of.values()
        )

    def _name(self, process: subprocess.Popen[bytes]) -> str:
        return self.name_of[process.pid]


def group_drained(client: Mapping[str, Any], group: str, topic: str) -> str:
    """Why `group` has not committed every partition of `topic` to its end (lag.drain); "" when
    it has. A measurement that fails (a cluster still moving after a fault) says so."""
    try:
        report = wait_drained(client, group, topic, timeout_s=0)
    except Exception as exc:
        return f"drain: {exc}"
    return "" if report.drained else "; ".join(undrained(report))


def wait_group_drained(client: Mapping[str, Any], group: str, topic: str, timeout_s: float) -> str:
    """Until `group_drained`; "" within `timeout_s`, else the last reason it was not."""
    deadline = time.monotonic() + timeout_s
    why = group_drained(client, group, topic)
    while why and time.monotonic() < deadline:
        time.sleep(1.0)
        why = group_drained(client, group, topic)
    return f"not drained after {timeout_s:.0f} s: {why}" if why else ""


def stop_once_committed(
    process: subprocess.Popen[bytes], undrained_why: Callable[[], str], timeout_s: float
) -> int:
    """SIGTERM `process` once its group committed everything (`undrained_why()` is "": see
    `group_drained`), rather than wait out its idle exit; its exit code. One that exits first
    (or never gets there) is waited for."""
    deadline = time.monotonic() + timeout_s
    while process.poll() is None and time.monotonic() < deadline:
        if not undrained_why():
            process.send_signal(signal.SIGTERM)
            break
        time.sleep(1.0)
    return process.wait(timeout_s)
