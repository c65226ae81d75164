"""The nodes of a local cluster: one node (a LocalBroker whose id, ports, properties and cluster
id come from the cluster's layout), the phased start of several and their joint stop.
Reasons: docs/local-kafka.md, "Local cluster (three nodes)"."""

from __future__ import annotations

import concurrent.futures
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from codeclog.devtools import security
from codeclog.devtools.broker import BrokerSettings, BrokerState, LocalBroker, StopResult
from codeclog.devtools.broker_config import BrokerPorts
from codeclog.devtools.broker_errors import ClusterError
from codeclog.devtools.cluster_layout import ClusterLayout, render_cluster_properties
from codeclog.devtools.host import (
    HOST,
    KILL_WAIT_S,
    kill_quietly,
    port_is_free,
    send_signal,
    wait_gone,
)
from codeclog.devtools.jvm import resolve_java
from codeclog.devtools.links import LISTENERS

Progress = Callable[[str], None]


class ClusterNode(LocalBroker):
    """A LocalBroker whose id, ports, properties and cluster id come from the cluster layout."""

    port_attempts = 1  # the ports are the quorum's: never re-picked

    def __init__(
        self, data_dir: Path, settings: BrokerSettings, node_id: int, layout: ClusterLayout
    ) -> None:
        super().__init__(data_dir, settings)
        self.node_id = node_id
        self.layout = layout

    @property
    def ports(self) -> BrokerPorts:
        return self.layout.node_ports(self.node_id)

    def _node_ports(self, previous: BrokerPorts | None) -> BrokerPorts:
        # a faultable node binds its real ports; Toxiproxy holds the advertised ones
        bound = (
            [self.layout.node_links(self.node_id).real(name) for name in LISTENERS]
            if self.layout.faultable
            else [self.ports.broker_port, self.ports.controller_port]
        )
        for port in bound:
            if not port_is_free(port):
                raise ClusterError(
                    f"port {port} of node {self.node_id} is taken by another process; the "
                    f"cluster's ports are fixed (its controller quorum): free it, or delete "
                    f"{self.data_dir.parent} and start a new cluster"
                )
        return self.ports

    def _node_properties(self, ports: BrokerPorts) -> str:
        secured = self._secured_properties(ports)
        return render_cluster_properties(self.layout, self.node_id, self.log_dirs, secured)

    @property
    def security_files(self) -> security.SecurityFiles:
        # One set for the whole cluster, in its root: one CA, one broker key (its SAN is
        # 127.0.0.1, every node's address; the controllers' mutual TLS admits every node by
        # it) and one set of SCRAM users, formatted into every node's bootstrap metadata.
        return security.security_files(self.data_dir.parent)

    def _security_state(self, bootstrap: str) -> dict[str, Any]:
        # the role files name every node, whichever node (re)started last
        return super()._security_state(self.layout.bootstrap)

    def prepare_security(self, java: str, progress: Progress) -> None:
        self._prepare_security(java, progress)

    def _node_format_args(self) -> list[str]:
        return []  # static controller.quorum.voters: no --standalone

    def _node_cluster_id(self) -> str:
        return self.layout.cluster_id

    # phased start: spawn every node first, then wait for each ---------------------------
    def prepare(self, java: str, libs_dir: Path, progress: Progress) -> None:
        """Check the ports, write server.properties, format the log dir once."""
        self.configure()
        self._make_data_dir()
        ports = self._node_ports(None)
        self.properties_path.write_text(self._node_properties(ports))
        self._format_if_needed(java, libs_dir, progress)

    def spawn(self, java: str, libs_dir: Path, progress: Progress) -> subprocess.Popen[bytes]:
        # From the caller's thread: with die_with_parent the kernel signals the JVM when the
        # *thread* that forked it ends, so never spawn from a short-lived worker thread.
        process = self._spawn(java, libs_dir)
        progress(f"node {self.node_id}: JVM started (pid {process.pid})")
        return process

    def await_started(self, process: subprocess.Popen[bytes], deadline: float) -> BrokerState:
        """Wait until the node serves requests, at most until `deadline` (time.monotonic)."""
        return self._await_started(process, self.ports, self.layout.cluster_id, deadline)

    def running_pid(self) -> int | None:
        state = self._running_state()
        return state.pid if state is not None else None


# ----------------------------------------------------------------------------- several nodes


def start_nodes(nodes: Sequence[ClusterNode], settings: BrokerSettings, progress: Progress) -> None:
    """Start `nodes`, none of them running: their security material, the jars, every log dir
    formatted, every JVM spawned, then each awaited; a failure kills the JVMs it spawned."""
    java = resolve_java(settings.java)
    for node in nodes:  # one after another: the first makes the material, the rest read it
        node.prepare_security(java, progress)
    libs_dir = settings.fetcher.ensure(progress)
    # Formatting is a JVM each: run them side by side, before any broker competes.
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        for done in [pool.submit(n.prepare, java, libs_dir, progress) for n in nodes]:
            done.result()
    _spawn_and_await(nodes, java, libs_dir, settings.start_timeout_s, progress)


def _spawn_and_await(
    nodes: Sequence[ClusterNode], java: str, libs_dir: Path, timeout_s: float, progress: Progress
) -> None:
    spawned: list[tuple[ClusterNode, subprocess.Popen[bytes]]] = []
    try:
        for node in nodes:
            spawned.append((node, node.spawn(java, libs_dir, progress)))
        progress("waiting until every node serves requests (a quorum must form first)")
        # one deadline for the whole cluster: --timeout-s is what the user waits at most
        deadline = time.monotonic() + timeout_s
        for node, process in spawned:
            node.await_started(process, deadline)
            progress(f"node {node.node_id}: ready on {HOST}:{node.ports.broker_port}")
    except BaseException:
        for _node, process in spawned:
            kill_quietly(process)
        raise


def stop_nodes(
    nodes: Sequence[ClusterNode], timeout_s: float, progress: Progress
) -> dict[int, StopResult]:
    """SIGTERM every running node at once (so the quorum lives while they shut down), SIGKILL
    whichever is still there after `timeout_s`; every node's state file goes. The data is kept."""
    started = time.monotonic()
    pids: dict[int, int] = {}
    for node in nodes:
        pid = node.running_pid()
        if pid is not None:
            pids[node.node_id] = pid
            send_signal(pid, signal.SIGCONT)  # a paused JVM cannot act on SIGTERM
            send_signal(pid, signal.SIGTERM)
    if pids:
        progress(f"stopping nodes {', '.join(map(str, pids))} (SIGTERM)")
    deadline = started + timeout_s
    return {
        node.node_id: _await_stop(node, pids.get(node.node_id), started, deadline, progress)
        for node in nodes
    }


def _await_stop(
    node: ClusterNode, pid: int | None, started: float, deadline: float, progress: Progress
) -> StopResult:
    """One node SIGTERMed at `started` (None: it was not running) gone by `deadline`, else
    SIGKILLed."""
    if pid is None:
        node._clear_state()
        return StopResult(False, False, 0.0, None)
    exited = wait_gone(pid, node.properties_path, deadline)
    if not exited:
        progress(f"node {node.node_id} ignored SIGTERM; killing it")
        send_signal(pid, signal.SIGKILL)
        wait_gone(pid, node.properties_path, time.monotonic() + KILL_WAIT_S)
    node._clear_state()
    return StopResult(True, not exited, time.monotonic() - started, None)
