"""This host as the local Kafka tools use it: ports on 127.0.0.1, processes and their signals, an
exclusive lock on a file, a file replaced in one step. Nothing here knows Kafka's protocol
(`pid_runs_broker` only recognises a Kafka JVM's command line and its server.properties)."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

HOST = "127.0.0.1"  # not "localhost": it may resolve to ::1 while Kafka binds IPv4
POLL_INTERVAL_S = 0.1
KILL_WAIT_S = 10.0
PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>

# ----------------------------------------------------------------------------- ports


def port_is_free(port: int) -> bool:
    # SO_REUSEADDR like the JVM's server sockets, so TIME_WAIT leftovers of our own previous
    # run do not count as "taken"; a live listener still does.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def pick_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def tcp_accepts(port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s):
            return True
    except OSError:
        return False


# ----------------------------------------------------------------------------- processes


def pid_runs_broker(pid: int, properties_path: Path) -> bool:
    """True when `pid` is alive and is the JVM started with this data dir's properties."""
    _reap_if_child(pid)
    cmdline_path = Path(f"/proc/{pid}/cmdline")
    if not Path("/proc/self/cmdline").exists():
        return pid_exists(pid)  # no procfs (macOS): the best check available
    try:
        cmdline = cmdline_path.read_bytes()
    except OSError:
        return False
    # A zombie has an empty cmdline; a reused pid has someone else's.
    return b"kafka.Kafka" in cmdline and str(properties_path).encode() in cmdline


def _reap_if_child(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_is_stopped(pid: int) -> bool:
    """True when the process is in the stopped state (SIGSTOP), from /proc/<pid>/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # "pid (comm) S ...": the comm may hold spaces or parentheses; the state follows the last ')'
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] in ("T", "t")


def wait_gone(
    pid: int,
    properties_path: Path,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Whether the broker JVM `pid` was gone by `deadline` (on `clock`), polling until then."""
    while pid_runs_broker(pid, properties_path):
        if clock() > deadline:
            return False
        time.sleep(POLL_INTERVAL_S)
    return True


def terminate(
    pid: int,
    properties_path: Path,
    timeout_s: float,
    child: subprocess.Popen[bytes] | None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[bool, int | None]:
    """SIGTERM the broker JVM `pid`, wait up to `timeout_s`, then SIGKILL it and wait up to
    KILL_WAIT_S: (forced: SIGKILL was needed, its exit code: known only when `child` is its
    Popen, this process having started it)."""
    send_signal(pid, signal.SIGTERM)
    exit_code, exited = _wait_exit(pid, properties_path, timeout_s, child, clock)
    if exited:
        return False, exit_code
    send_signal(pid, signal.SIGKILL)
    exit_code, _ = _wait_exit(pid, properties_path, KILL_WAIT_S, child, clock)
    return True, exit_code


def _wait_exit(
    pid: int,
    properties_path: Path,
    timeout_s: float,
    child: subprocess.Popen[bytes] | None,
    clock: Callable[[], float],
) -> tuple[int | None, bool]:
    """(exit code if known, exited?) after waiting up to timeout_s."""
    if child is not None:
        try:
            return child.wait(timeout=timeout_s), True
        except subprocess.TimeoutExpired:
            return None, False
    return None, wait_gone(pid, properties_path, clock() + timeout_s, clock)


def send_signal(pid: int, signum: signal.Signals) -> None:
    """Signal `pid`; a process already gone is no error."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def kill_quietly(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a child and reap it (waiting up to KILL_WAIT_S); errors are swallowed."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        process.kill()
        process.wait(timeout=KILL_WAIT_S)


def parent_death_hook() -> Callable[[], None] | None:
    """A preexec hook asking the kernel to SIGTERM the child when its parent dies (Linux only).

    prctl is looked up here, in the parent: the hook runs between fork and exec, where a
    dlopen/dlsym could deadlock on a lock that another thread (librdkafka's) held at fork.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    sigterm = int(signal.SIGTERM)

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, sigterm)

    return hook


# ----------------------------------------------------------------------------- files


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` (created if missing) for the block: one CLI at a time."""
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_atomically(path: Path, text: str) -> None:
    """Write `path` through a temporary file beside it: a reader sees the old text or the new."""
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(text)
    temp.replace(path)
