"""A real local Kafka cluster: N KRaft nodes (broker+controller each) on 127.0.0.1, one JVM each.
Its data dir, quorum and faults: docs/local-kafka.md, "Local cluster (three nodes)"."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from codeclog.devtools import security
from codeclog.devtools.broker import (
    BrokerSettings,
    BrokerState,
    BrokerStatus,
    BrokerStatusKind,
    LocalBroker,
    StopResult,
)
from codeclog.devtools.broker_config import BrokerPorts, new_cluster_id
from codeclog.devtools.broker_errors import ClusterError, ClusterSizeError
from codeclog.devtools.cluster_layout import ClusterLayout
from codeclog.devtools.cluster_nodes import ClusterNode, start_nodes, stop_nodes
from codeclog.devtools.host import (
    HOST,
    KILL_WAIT_S,
    file_lock,
    process_is_stopped,
    send_signal,
    wait_gone,
    write_atomically,
)
from codeclog.devtools.links import (
    HEAL,
    LINKS,
    LISTENERS,
    Fault,
    LinkError,
    LinkUsageError,
    Toxiproxy,
    apply,
    describe_toxic,
    find_server,
)
from codeclog.user_files import make_folder

CLUSTER_FILE = "cluster.json"
CLUSTER_LOCK = ".cluster.lock"
NODE_DIR_PREFIX = "node-"
MAX_NODES = 9
# Per node: the heap bound and what one node measured on this project's 2-core, 24 GB box.
NODE_HEAP_MIN_MB = 128
NODE_HEAP_MAX_MB = 512
NODE_RSS_NOTE = "about 180 MB resident per node after start, at most about 0.7 GB, 2 GB for three"
# `broker start --timeout-s` for a cluster: its JVMs share the cores (one broker: 60 s)
CLUSTER_START_TIMEOUT_S = 120.0

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    return None


# ----------------------------------------------------------------------------- status


class NodeStatusKind(enum.Enum):
    RUNNING = "running"
    PAUSED = "paused"  # SIGSTOPped: alive but answers nothing
    STOPPED = "stopped"
    CRASHED = "crashed"  # killed (or died) without `stop`


@dataclasses.dataclass(frozen=True)
class NodeStatus:
    node_id: int
    kind: NodeStatusKind
    ports: BrokerPorts
    broker: BrokerStatus


@dataclasses.dataclass(frozen=True)
class LinksStatus:
    """A faultable cluster's Toxiproxy: its pid (None: not running) and what keeps clients
    from reaching the nodes through its proxies (empty: nothing)."""

    pid: int | None
    api: str
    problems: tuple[str, ...]


# ----------------------------------------------------------------------------- the cluster


class LocalCluster:
    """N nodes under one data dir. Lifecycle: start, stop, status; kill/pause/resume/restart."""

    def __init__(
        self,
        data_dir: Path,
        nodes: int | None = None,
        settings: BrokerSettings | None = None,
        *,
        faultable: bool = False,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.requested_nodes = nodes
        self.requested_faultable = faultable  # a new cluster's links run through Toxiproxy
        self.settings = (
            settings
            if settings is not None
            else BrokerSettings(heap_min_mb=NODE_HEAP_MIN_MB, heap_max_mb=NODE_HEAP_MAX_MB)
        )
        self._random_bytes = random_bytes
        self._nodes: dict[int, ClusterNode] = {}
        if nodes is not None and not 2 <= nodes <= MAX_NODES:
            raise ClusterSizeError(f"a local cluster has 2..{MAX_NODES} nodes, not {nodes}")

    @staticmethod
    def holds_cluster(data_dir: Path) -> bool:
        return (Path(data_dir) / CLUSTER_FILE).is_file()

    @property
    def layout_path(self) -> Path:
        return self.data_dir / CLUSTER_FILE

    def layout(self) -> ClusterLayout:
        try:
            return ClusterLayout.from_json(self.layout_path.read_text())
        except OSError as exc:
            raise ClusterError(f"no local cluster in {self.data_dir} ({exc.strerror})") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise ClusterError(f"{self.layout_path} is not a codeclog cluster file: {exc}") from exc

    def node(self, node_id: int) -> ClusterNode:
        layout = self.layout()
        if node_id not in layout.node_ids:
            raise ClusterError(f"the cluster has nodes 1..{layout.nodes}, not node {node_id}")
        if node_id not in self._nodes:
            node_dir = self.data_dir / f"{NODE_DIR_PREFIX}{node_id}"
            self._nodes[node_id] = ClusterNode(node_dir, self.settings, node_id, layout)
        return self._nodes[node_id]

    @property
    def bootstrap(self) -> str:
        return self.layout().bootstrap

    # lifecycle --------------------------------------------------------------------------
    def start(self, progress: Progress = _quiet) -> ClusterLayout:
        """Start every node that is not running (creating the cluster if needed); idempotent.
        A start that fails stops what it started: the nodes it spawned, and Toxiproxy when it
        was not running before."""
        self.settings.validate()
        if self.requested_faultable:
            find_server()  # before anything is written: a missing tool is one line, exit 2
        self._make_dir()
        with self._locked():
            layout = self._load_or_create(progress)
            if not layout.faultable:
                return self._start_nodes(layout, progress)
            # the proxies first: nodes and clients reach each other by them
            toxiproxy = self.toxiproxy(layout)
            started = toxiproxy.start(layout.links)
            try:
                return self._start_nodes(layout, progress)
            except BaseException:
                if started:
                    toxiproxy.stop()
                raise

    def _start_nodes(self, layout: ClusterLayout, progress: Progress) -> ClusterLayout:
        pending = [self.node(n) for n in layout.node_ids if self.node(n).running_pid() is None]
        if not pending:
            progress(f"all {layout.nodes} nodes already run")
            return layout
        start_nodes(pending, self.settings, progress)
        return layout

    def role_configs(self) -> dict[str, Path]:
        """user -> its librdkafka properties file, for a secured cluster (empty otherwise)."""
        files = security.security_files(self.data_dir)
        if not files.complete():
            return {}
        users = security.read_credentials(files).users
        return {
            user: files.role_properties(user)
            for user in users
            if files.role_properties(user).exists()
        }

    def stop(self, progress: Progress = _quiet) -> dict[int, StopResult]:
        """SIGTERM every node at once (so the quorum lives while they shut down), SIGKILL
        whichever is still there after stop_timeout_s. The data is kept."""
        if not self.layout_path.is_file():
            return {}
        with self._locked():
            layout = self.layout()
            nodes = [self.node(node_id) for node_id in layout.node_ids]
            results = stop_nodes(nodes, self.settings.stop_timeout_s, progress)
            if layout.faultable:
                self.toxiproxy(layout).stop()
            return results

    def status(self) -> tuple[NodeStatus, ...]:
        layout = self.layout()
        out = []
        for node_id in layout.node_ids:
            broker_status = self.node(node_id).status()
            kind = NodeStatusKind(broker_status.kind.value)
            state = broker_status.state
            if kind is NodeStatusKind.RUNNING and state and process_is_stopped(state.pid):
                kind = NodeStatusKind.PAUSED
            out.append(NodeStatus(node_id, kind, layout.node_ports(node_id), broker_status))
        return tuple(out)

    def links_status(self) -> LinksStatus | None:
        """Toxiproxy and every proxy of a faultable cluster (None for a cluster not faultable):
        nodes that run behind a dead Toxiproxy, or a missing proxy, serve no client."""
        layout = self.layout()
        if not layout.faultable:
            return None
        toxiproxy = self.toxiproxy(layout)
        names = [node.proxy(listener) for node in layout.links for listener in LISTENERS]
        return LinksStatus(
            toxiproxy.running_pid(),
            f"{HOST}:{layout.toxiproxy_api}",
            tuple(toxiproxy.problems(names)),
        )

    # faults -------------------------------------------------------------------------------
    def toxiproxy(self, layout: ClusterLayout | None = None) -> Toxiproxy:
        layout = layout or self.layout()
        return Toxiproxy(self.data_dir, layout.toxiproxy_api)

    def net(self, node_id: int, link: str, fault: Fault, progress: Progress = _quiet) -> None:
        """Make one node's link fail as `fault` says (or heal it): LinkUsageError (exit 2)
        for a cluster not started faultable, an unknown node or link."""
        layout = self.layout()
        if link not in LINKS:
            raise LinkUsageError(f"a link is one of {', '.join(LINKS)}, not {link!r}")
        proxies = layout.node_links(node_id).proxies(link)
        fault.check()
        try:
            apply(self.toxiproxy(layout), proxies, fault)
        except LinkError as exc:
            raise LinkError(f"node {node_id}, link {link}: {exc}") from exc
        progress(f"node {node_id}, link {link}: {fault.describe()}")

    def heal_all(self) -> None:
        """Every link of every node back to normal (a faultable cluster; else nothing)."""
        layout = self.layout()
        if layout.faultable:
            toxiproxy = self.toxiproxy(layout)
            for node in layout.links:
                apply(toxiproxy, [node.proxy(name) for name in LISTENERS], HEAL)

    def link_faults(self) -> dict[tuple[int, str], list[str]]:
        """(node, link) -> the toxics in place (empty: healthy), for `broker net`'s table."""
        layout = self.layout()
        toxiproxy = self.toxiproxy(layout)
        return {
            (node.node_id, link): sorted(
                {
                    describe_toxic(toxic)
                    for proxy in node.proxies(link)
                    for toxic in toxiproxy.toxics(proxy)
                }
            )
            for node in layout.links
            for link in LINKS
        }

    def kill(self, node_id: int, progress: Progress = _quiet) -> int:
        """SIGKILL the node's JVM (no shutdown at all); returns its pid. Its state file stays,
        so `status` says crashed until `restart`."""
        node, pid = self._running_node(node_id, "kill")
        with self._locked():
            send_signal(pid, signal.SIGCONT)
            send_signal(pid, signal.SIGKILL)
            if not wait_gone(pid, node.properties_path, time.monotonic() + KILL_WAIT_S):
                raise ClusterError(f"node {node_id} (pid {pid}) survived SIGKILL")
        progress(f"node {node_id} killed (SIGKILL to pid {pid})")
        return pid

    def pause(self, node_id: int, progress: Progress = _quiet) -> int:
        """SIGSTOP the node's JVM: it holds its sockets but answers nothing, like a long GC."""
        _node, pid = self._running_node(node_id, "pause")
        send_signal(pid, signal.SIGSTOP)
        progress(f"node {node_id} paused (SIGSTOP to pid {pid}); `resume --node {node_id}`")
        return pid

    def resume(self, node_id: int, progress: Progress = _quiet) -> int:
        _node, pid = self._running_node(node_id, "resume")
        send_signal(pid, signal.SIGCONT)
        progress(f"node {node_id} resumed (SIGCONT to pid {pid})")
        return pid

    def restart(self, node_id: int, progress: Progress = _quiet) -> BrokerState:
        """Stop the node if it runs (SIGTERM), then start it with the same ports and data."""
        node = self.node(node_id)
        with self._locked():
            pid = node.running_pid()
            if pid is not None:
                send_signal(pid, signal.SIGCONT)
                progress(f"node {node_id}: stopping (pid {pid})")
                node.stop()
            progress(f"node {node_id}: starting")
            return node.start(progress)

    def pid_of(self, node_id: int) -> int | None:
        return self.node(node_id).running_pid()

    # internals ----------------------------------------------------------------------------
    def _running_node(self, node_id: int, action: str) -> tuple[ClusterNode, int]:
        node = self.node(node_id)
        pid = node.running_pid()
        if pid is None:
            raise ClusterError(f"cannot {action} node {node_id}: it is not running")
        return node, pid

    def _load_or_create(self, progress: Progress) -> ClusterLayout:
        if self.layout_path.is_file():
            layout = self.layout()
            if self.requested_nodes is not None and self.requested_nodes != layout.nodes:
                raise ClusterError(
                    f"{self.data_dir} holds a {layout.nodes}-node cluster, not "
                    f"{self.requested_nodes}; use another --data-dir for another size"
                )
            if self.requested_faultable and not layout.faultable:
                raise LinkUsageError(
                    f"{self.data_dir} holds a cluster that is not faultable; use another "
                    "--data-dir for a faultable one"
                )
            return layout
        if (self.data_dir / "kafka").exists() or (self.data_dir / "broker.json").exists():
            raise ClusterError(
                f"{self.data_dir} holds a single-node broker; use another --data-dir for a cluster"
            )
        nodes = self.requested_nodes or 3
        if self.requested_faultable and self.settings.security not in (None, "none"):
            raise LinkUsageError("a faultable cluster is plaintext only: drop --security")
        layout = ClusterLayout.fresh(
            nodes, new_cluster_id(self._random_bytes), faultable=self.requested_faultable
        )
        progress(f"new {nodes}-node cluster {layout.cluster_id} in {self.data_dir}")
        write_atomically(self.layout_path, layout.to_json())
        self._nodes.clear()
        return layout

    def _make_dir(self) -> None:
        make_folder(self.data_dir, "the data dir")

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return file_lock(self.data_dir / CLUSTER_LOCK)


def cluster_bootstrap(data_dir: Path) -> str | None:
    """The running nodes' bootstrap list of the cluster in `data_dir`, or None if none runs."""
    cluster = LocalCluster(data_dir)
    try:
        statuses = cluster.status()
    except ClusterError:
        return None
    running = [
        f"{HOST}:{s.ports.broker_port}"
        for s in statuses
        if s.kind in (NodeStatusKind.RUNNING, NodeStatusKind.PAUSED)
    ]
    return ",".join(running) or None


__all__ = [
    "LinksStatus",
    "LocalCluster",
    "NodeStatus",
    "NodeStatusKind",
    "cluster_bootstrap",
    "local_bootstrap",
]


def local_bootstrap(data_dir: Path) -> str | None:
    """The bootstrap address of the broker running for `data_dir`, or None if none runs.
    For a local cluster's data dir: the comma-separated addresses of its running nodes."""
    if LocalCluster.holds_cluster(data_dir):
        return cluster_bootstrap(data_dir)
    status = LocalBroker(data_dir).status()
    if status.kind is BrokerStatusKind.RUNNING and status.state is not None:
        return status.state.bootstrap
    return None
