"""A real single-node Kafka 4.3 (KRaft, broker+controller in one JVM) on 127.0.0.1, per data dir.
Its data dir and readiness: docs/local-kafka.md, "Local broker"."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from codeclog.devtools import security
from codeclog.devtools.broker_config import (
    NODE_ID,
    BrokerPorts,
    choose_ports,
    new_cluster_id,
    parse_listener_ports,
    render_server_properties,
)
from codeclog.devtools.broker_errors import (
    BrokerError,
    BrokerStartError,
    PortInUseError,
)
from codeclog.devtools.host import (
    HOST,
    POLL_INTERVAL_S,
    file_lock,
    kill_quietly,
    pick_free_port,
    pid_runs_broker,
    port_is_free,
    tcp_accepts,
    terminate,
    write_atomically,
)
from codeclog.devtools.jars import KAFKA_VERSION, JarFetcher
from codeclog.devtools.jvm import (
    broker_command,
    exit_error,
    format_command,
    iso_utc,
    log_tail,
    read_cluster_id,
    resolve_java,
    run_format,
    spawn_logged,
)
from codeclog.json_values import json_object
from codeclog.kafka.log import client_settings
from codeclog.user_files import make_folder

STATE_FILE = "broker.json"
PROPERTIES_FILE = "server.properties"
LOG_FILE = "broker.log"
LOG_DIRS = "kafka"
LOCK_FILE = ".broker.lock"
PORT_ATTEMPTS = 3  # another process may grab a port between our probe and the JVM's bind

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    return None


# ----------------------------------------------------------------------------- values

BROKER_START_TIMEOUT_S = 60.0  # `broker start --timeout-s` for one broker


@dataclasses.dataclass(frozen=True)
class BrokerSettings:
    """How to run the JVM. `validate` checks values only; nothing here does I/O."""

    java: str | None = None  # None: $CODECLOG_JAVA, else $JAVA_HOME/bin/java, else `java`
    heap_min_mb: int = 256
    heap_max_mb: int = 1024  # plenty with the 2 MiB cleaner dedupe buffer below
    start_timeout_s: float = BROKER_START_TIMEOUT_S
    stop_timeout_s: float = 30.0
    # Linux only: the kernel sends the JVM SIGTERM when the process that started it dies, so a
    # killed test session leaves no broker behind. The CLI leaves it off (detached broker).
    die_with_parent: bool = False
    extra_jvm_args: tuple[str, ...] = ()  # appended after ours, so they win (e.g. "-Xss2m")
    # "scram": SASL_SSL + SCRAM-SHA-512 + ACLs (codeclog.devtools.security); "none": PLAINTEXT;
    # None: whatever the data dir already holds (none for a fresh one).
    security: str | None = None
    fetcher: JarFetcher = dataclasses.field(default_factory=JarFetcher)

    def validate(self) -> None:
        if not 64 <= self.heap_min_mb <= self.heap_max_mb:
            raise BrokerError(
                f"broker heap must satisfy 64 <= min <= max MiB, got "
                f"{self.heap_min_mb}..{self.heap_max_mb}"
            )
        if self.start_timeout_s <= 0 or self.stop_timeout_s <= 0:
            raise BrokerError("broker start and stop timeouts must be positive")
        if self.security is not None:
            security.check_mode(self.security)


@dataclasses.dataclass(frozen=True)
class BrokerState:
    """What `broker.json` holds about a running broker."""

    pid: int
    broker_port: int
    controller_port: int
    bootstrap: str  # host:port for bootstrap.servers
    cluster_id: str
    data_dir: str
    log_path: str
    started_at: str  # ISO-8601 UTC
    kafka_version: str = KAFKA_VERSION
    security: str = security.SECURITY_NONE
    role_configs: dict[str, str] = dataclasses.field(default_factory=dict)  # user -> properties

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> BrokerState:
        raw = json_object(text)
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in raw.items() if key in names})


class BrokerStatusKind(enum.Enum):
    RUNNING = "running"
    STOPPED = "stopped"
    CRASHED = "crashed"  # a state file names a pid that is gone: killed without `stop`


@dataclasses.dataclass(frozen=True)
class BrokerStatus:
    kind: BrokerStatusKind
    data_dir: Path
    log_path: Path
    state: BrokerState | None  # the running broker's state, or the stale one when CRASHED


@dataclasses.dataclass(frozen=True)
class StopResult:
    was_running: bool
    forced: bool  # SIGTERM did not end it within the timeout; SIGKILL did
    elapsed_s: float
    exit_code: int | None  # known only when this process started the JVM


def metadata_lists_broker(
    bootstrap: str,
    timeout_s: float = 5.0,
    node_id: int = NODE_ID,
    client_config: dict[str, str] | None = None,
) -> bool:
    """A real Kafka round trip: the cluster metadata names our node."""
    admin = AdminClient(
        client_settings(client_config or {}, {"bootstrap.servers": bootstrap, "log_level": 2})
    )
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except Exception:  # KafkaException and transport errors: not ready yet
        return False
    return node_id in metadata.brokers


# ----------------------------------------------------------------------------- the broker


class LocalBroker:
    """One broker for one data dir. Lifecycle: configure (validate), start, stop; status.

    A node of a LocalCluster (codeclog.devtools.cluster_nodes.ClusterNode) is a subclass that
    overrides the `_node_*` hooks: its node id, fixed ports, properties and format mode.
    """

    node_id: int = NODE_ID
    port_attempts: int = PORT_ATTEMPTS

    def __init__(
        self,
        data_dir: Path,
        settings: BrokerSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.settings = settings if settings is not None else BrokerSettings()
        self._clock = clock
        self._wall_clock = wall_clock
        self._random_bytes = random_bytes
        self._process: subprocess.Popen[bytes] | None = None  # set when this object started it
        self._credentials: security.Credentials | None = None  # set by start when secured

    # paths --------------------------------------------------------------------------------
    @property
    def properties_path(self) -> Path:
        return self.data_dir / PROPERTIES_FILE

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_FILE

    @property
    def state_path(self) -> Path:
        return self.data_dir / STATE_FILE

    @property
    def log_dirs(self) -> Path:
        return self.data_dir / LOG_DIRS

    @property
    def security_files(self) -> security.SecurityFiles:
        return security.security_files(self.data_dir)

    def security_mode(self) -> str:
        """The mode this start uses: the one asked for, checked against the data dir."""
        formatted = (self.log_dirs / "meta.properties").exists()
        asked = self.settings.security
        return security.start_mode(asked, formatted, self.security_files, self.data_dir)

    def admin_client_config(self) -> dict[str, str]:
        """Client properties of the super user (empty for a plaintext broker)."""
        creds = self._credentials
        return {} if creds is None else security.admin_properties(self.security_files, creds)

    # lifecycle ----------------------------------------------------------------------------
    def configure(self) -> None:
        self.settings.validate()

    def start(self, progress: Progress = _quiet) -> BrokerState:
        """Start the broker (fetching jars and formatting the dir if needed); idempotent."""
        self.configure()
        self._make_data_dir()
        with self._locked():
            running = self._running_state()
            if running is not None:
                progress(f"a broker already runs for {self.data_dir} (pid {running.pid})")
                return running
            java = resolve_java(self.settings.java)
            self._prepare_security(java, progress)
            libs_dir = self.settings.fetcher.ensure(progress)
            return self._start_with_port_retries(java, libs_dir, progress)

    def _prepare_security(self, java: str, progress: Progress) -> None:
        if self.security_mode() != security.SECURITY_SCRAM:
            return
        files = self.security_files
        if not files.complete():
            progress(f"making a local CA, the broker certificate and SCRAM users in {files.root}")
        self._credentials = security.ensure_material(files, security.keytool_for(java))

    def stop(self, progress: Progress = _quiet) -> StopResult:
        """SIGTERM, wait up to stop_timeout_s, then SIGKILL. Stopping a stopped broker is fine."""
        if not self.data_dir.is_dir():
            return StopResult(False, False, 0.0, None)
        with self._locked():
            state = self._read_state()
            if state is None or not pid_runs_broker(state.pid, self.properties_path):
                self._clear_state()
                return StopResult(False, False, 0.0, None)
            progress(f"stopping the broker (pid {state.pid})")
            result = self._terminate(state.pid)
            self._clear_state()
            return result

    def status(self) -> BrokerStatus:
        state = self._read_state()
        if state is None:
            kind = BrokerStatusKind.STOPPED
        elif pid_runs_broker(state.pid, self.properties_path):
            kind = BrokerStatusKind.RUNNING
        else:
            kind = BrokerStatusKind.CRASHED
        return BrokerStatus(kind, self.data_dir, self.log_path, state)

    def log_tail(self, max_lines: int = 40) -> str:
        """The last lines the broker logged in its latest run."""
        return log_tail(self.log_path, max_lines)

    # hooks for cluster nodes ----------------------------------------------------------------
    def _node_ports(self, previous: BrokerPorts | None) -> BrokerPorts:
        return choose_ports(previous, port_is_free, pick_free_port)

    def _node_properties(self, ports: BrokerPorts) -> str:
        return render_server_properties(ports, self.log_dirs, self._secured_properties(ports))

    def _secured_properties(self, ports: BrokerPorts) -> dict[str, str] | None:
        """The listener, TLS, SASL and authorizer overrides when secured, else None."""
        if self._credentials is None:
            return None
        return security.server_security_properties(
            ports.broker_port, ports.controller_port, HOST, self.security_files, self._credentials
        )

    def _node_format_args(self) -> list[str]:
        return ["--standalone"]  # goes with controller.quorum.bootstrap.servers

    def _node_cluster_id(self) -> str:
        return new_cluster_id(self._random_bytes)

    # start internals ------------------------------------------------------------------------
    def _make_data_dir(self) -> None:
        make_folder(self.data_dir, "the data dir")

    def _start_with_port_retries(
        self, java: str, libs_dir: Path, progress: Progress
    ) -> BrokerState:
        previous = self._previous_ports()
        for attempt in range(self.port_attempts):
            ports = self._node_ports(previous)
            if previous is not None and ports != previous:
                progress(
                    f"the previous ports {previous.broker_port}/{previous.controller_port} are "
                    f"taken; using {ports.broker_port}/{ports.controller_port}"
                )
            self.properties_path.write_text(self._node_properties(ports))
            cluster_id = self._format_if_needed(java, libs_dir, progress)
            try:
                return self._launch(java, libs_dir, ports, cluster_id, progress)
            except PortInUseError:
                if attempt == self.port_attempts - 1:
                    raise
                progress("a port was taken while the broker started; retrying with new ports")
                previous = None
        raise AssertionError("unreachable")

    def _previous_ports(self) -> BrokerPorts | None:
        try:
            return parse_listener_ports(self.properties_path.read_text())
        except OSError:
            return None

    def _format_if_needed(self, java: str, libs_dir: Path, progress: Progress) -> str:
        meta = self.log_dirs / "meta.properties"
        if meta.exists():
            return read_cluster_id(meta)
        cluster_id = self._node_cluster_id()
        progress(f"formatting {self.log_dirs} (cluster id {cluster_id})")
        args = [
            *self._node_format_args(),
            *(security.scram_format_args(self._credentials) if self._credentials else []),
        ]
        command = format_command(java, libs_dir, self.properties_path, cluster_id, args)
        run_format(command, self.log_dirs)
        return cluster_id

    def _launch(
        self, java: str, libs_dir: Path, ports: BrokerPorts, cluster_id: str, progress: Progress
    ) -> BrokerState:
        process = self._spawn(java, libs_dir)
        progress(f"broker JVM started (pid {process.pid}); waiting until it serves requests")
        return self._await_started(process, ports, cluster_id)

    def _await_started(
        self,
        process: subprocess.Popen[bytes],
        ports: BrokerPorts,
        cluster_id: str,
        deadline: float | None = None,
    ) -> BrokerState:
        """Wait until the spawned JVM serves requests (until `deadline` on this broker's clock,
        else start_timeout_s from now), then record its state file."""
        bootstrap = f"{HOST}:{ports.broker_port}"
        if deadline is None:
            deadline = self._clock() + self.settings.start_timeout_s
        try:
            self._wait_ready(process, ports.broker_port, bootstrap, deadline)
        except BaseException:
            kill_quietly(process)
            raise
        state = BrokerState(
            pid=process.pid,
            broker_port=ports.broker_port,
            controller_port=ports.controller_port,
            bootstrap=bootstrap,
            cluster_id=cluster_id,
            data_dir=str(self.data_dir),
            log_path=str(self.log_path),
            started_at=iso_utc(self._wall_clock()),
            **self._security_state(bootstrap),
        )
        write_atomically(self.state_path, state.to_json())
        return state

    def _security_state(self, bootstrap: str) -> dict[str, Any]:
        if self._credentials is None:
            return {}
        written = security.write_role_properties(self.security_files, self._credentials, bootstrap)
        return {
            "security": security.SECURITY_SCRAM,
            "role_configs": {user: str(path) for user, path in written.items()},
        }

    def _spawn(self, java: str, libs_dir: Path) -> subprocess.Popen[bytes]:
        settings = self.settings
        command = broker_command(
            java,
            libs_dir,
            self.properties_path,
            logs_dir=self.data_dir,
            heap_mb=(settings.heap_min_mb, settings.heap_max_mb),
            extra_args=settings.extra_jvm_args,
        )
        started_at = iso_utc(self._wall_clock())
        self._process = spawn_logged(
            command, self.log_path, self.data_dir, started_at, settings.die_with_parent
        )
        return self._process

    def _wait_ready(
        self, process: subprocess.Popen[bytes], port: int, bootstrap: str, deadline: float
    ) -> None:
        while True:
            code = process.poll()
            if code is not None:
                raise exit_error(code, self.log_path)
            if tcp_accepts(port) and metadata_lists_broker(
                bootstrap, node_id=self.node_id, client_config=self.admin_client_config()
            ):
                return
            if self._clock() > deadline:
                raise BrokerStartError(
                    f"the Kafka broker did not become ready within "
                    f"{self.settings.start_timeout_s:.0f} s; see {self.log_path}",
                    self.log_tail(),
                )
            time.sleep(POLL_INTERVAL_S)

    # stop internals ------------------------------------------------------------------------
    def _terminate(self, pid: int) -> StopResult:
        started = self._clock()
        child = self._process if self._process is not None and self._process.pid == pid else None
        stop_s = self.settings.stop_timeout_s
        forced, exit_code = terminate(pid, self.properties_path, stop_s, child, self._clock)
        return StopResult(True, forced, self._clock() - started, exit_code)

    # state file -------------------------------------------------------------------------------
    def _read_state(self) -> BrokerState | None:
        try:
            return BrokerState.from_json(self.state_path.read_text())
        except (OSError, ValueError, TypeError):
            return None

    def _running_state(self) -> BrokerState | None:
        state = self._read_state()
        if state is not None and pid_runs_broker(state.pid, self.properties_path):
            return state
        return None

    def _clear_state(self) -> None:
        self.state_path.unlink(missing_ok=True)

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return file_lock(self.data_dir / LOCK_FILE)
