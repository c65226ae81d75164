"""A real single-node Kafka 4.3 (KRaft, broker+controller in one JVM) on 127.0.0.1, per data dir.

Layout of a data dir:
  server.properties   written at every start (ports may change between starts)
  kafka/              Kafka's log dir, formatted once (meta.properties holds the cluster id)
  broker.log          the JVM's stdout and stderr, appended; one banner line per start
  broker.json         state of the running broker (pid, ports, bootstrap, ...); removed on stop
  .broker.lock        serialises start and stop of this data dir

The JVM runs detached (own session), so `codeclog broker start` returns while it keeps running.
Ready means: the PLAINTEXT port accepts TCP (Kafka opens it only once the broker is unfenced)
AND a metadata request through confluent-kafka lists this broker.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import enum
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from base64 import urlsafe_b64encode
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from codeclog.devtools import security
from codeclog.devtools.jars import KAFKA_VERSION, JarFetcher, runtime_file
from codeclog.errors import CodeclogError, UsageError
from codeclog.json_values import json_object
from codeclog.kafka.log import client_settings
from codeclog.user_files import make_folder

ENV_JAVA = "CODECLOG_JAVA"
MIN_JAVA_MAJOR = 17
NODE_ID = 1
HOST = "127.0.0.1"  # not "localhost": it may resolve to ::1 while Kafka binds IPv4
STATE_FILE = "broker.json"
PROPERTIES_FILE = "server.properties"
LOG_FILE = "broker.log"
LOG_DIRS = "kafka"
LOCK_FILE = ".broker.lock"
LOG_ROTATE_BYTES = 20 * 1024 * 1024
START_BANNER = "==== codeclog broker start"
PORT_ATTEMPTS = 3  # another process may grab a port between our probe and the JVM's bind
POLL_INTERVAL_S = 0.1
FORMAT_TIMEOUT_S = 120.0
KILL_WAIT_S = 10.0
PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    return None


class BrokerError(CodeclogError):
    """The local broker could not be started, stopped or inspected."""


class JavaNotFoundError(BrokerError):
    """No `java` executable where we looked."""


class JavaTooOldError(BrokerError):
    """Kafka 4 brokers need Java 17 or newer."""


class BrokerFormatError(BrokerError):
    """`kafka.tools.StorageTool format` failed on the data dir."""


class BrokerStartError(BrokerError):
    """The JVM exited during start-up or did not become ready in time."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


class SecurityModeError(BrokerError, UsageError):
    """The data dir was formatted for another security mode than the one asked for."""


class PortInUseError(BrokerStartError):
    """The JVM could not bind a port we picked (lost a race with another process)."""


# ----------------------------------------------------------------------------- values

BROKER_START_TIMEOUT_S = 60.0  # `broker start --timeout-s` for one broker


@dataclasses.dataclass(frozen=True)
class BrokerPorts:
    broker_port: int  # PLAINTEXT listener, the bootstrap port
    controller_port: int  # KRaft CONTROLLER listener


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


# ----------------------------------------------------------------------------- pure helpers


def new_cluster_id(random_bytes: Callable[[int], bytes] = os.urandom) -> str:
    """Kafka's Uuid.toString(): 22 url-safe base64 chars; never starting with '-' (argparse)."""
    while True:
        cluster_id = urlsafe_b64encode(random_bytes(16)).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def render_server_properties(
    ports: BrokerPorts, log_dirs: Path, secured: dict[str, str] | None = None
) -> str:
    """server.properties for one combined node; see the table in docs (kafka.md A.5).
    `secured` (codeclog.devtools.security.server_security_properties) replaces the listeners."""
    props = {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        # Dynamic quorum, formatted with --standalone. The voter's endpoint is also written
        # into the metadata log at format time; a single voter still elects itself when the
        # controller port changes on a later start (checked by the restart test).
        "controller.quorum.bootstrap.servers": f"{HOST}:{ports.controller_port}",
        **plaintext_listeners(ports),
        "log.dirs": str(log_dirs),
        **node_settings(replication=1, min_isr=1, internal_partitions=1),
        **(secured or {}),
    }
    lines = ["# written by codeclog at every `broker start`; edits are overwritten"]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


def plaintext_listeners(ports: BrokerPorts) -> dict[str, str]:
    """A node's listeners without security: clients and the controller quorum on HOST
    (codeclog.devtools.security's properties replace these on a secured node)."""
    return {
        "listeners": f"PLAINTEXT://{HOST}:{ports.broker_port},"
        f"CONTROLLER://{HOST}:{ports.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{ports.broker_port}",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    }


def node_settings(replication: int, min_isr: int, internal_partitions: int) -> dict[str, str]:
    """What a single broker and a cluster node share: the internal topics' replication (the
    defaults, RF 3 / min ISR 2, would leave one broker without transactions or consumer
    groups: COORDINATOR_NOT_AVAILABLE, NOT_ENOUGH_REPLICAS), topic defaults, and sizing for a
    small machine."""
    replicas, isr = str(replication), str(min_isr)
    return {
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": str(internal_partitions),
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": str(internal_partitions),
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": isr,
        "share.coordinator.state.topic.num.partitions": "1",
        "num.partitions": "1",
        "default.replication.factor": replicas,
        "min.insync.replicas": isr,
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        # The default 128 MiB is allocated at start-up and would dominate a small heap.
        "log.cleaner.dedupe.buffer.size": "2097152",
        "auto.create.topics.enable": "true",
    }


_LISTENER_RE = re.compile(r"^listeners=(.*)$", re.MULTILINE)
_PORT_RE = re.compile(r"(PLAINTEXT|SASL_SSL|CONTROLLER)://[^:,]*:(\d+)")


def parse_listener_ports(properties_text: str) -> BrokerPorts | None:
    """The ports of a server.properties we wrote, or None if it has no usable listeners line."""
    match = _LISTENER_RE.search(properties_text)
    if match is None:
        return None
    found = {name: int(port) for name, port in _PORT_RE.findall(match.group(1))}
    client = found.get("PLAINTEXT", found.get("SASL_SSL"))
    if client is None or "CONTROLLER" not in found:
        return None
    return BrokerPorts(client, found["CONTROLLER"])


def choose_ports(
    previous: BrokerPorts | None,
    is_free: Callable[[int], bool],
    pick: Callable[[], int],
) -> BrokerPorts:
    """Reuse the previous ports when both are free, else pick two new distinct ones."""
    if previous is not None and is_free(previous.broker_port) and is_free(previous.controller_port):
        return previous
    broker_port = pick()
    controller_port = pick()
    while controller_port == broker_port:
        controller_port = pick()
    return BrokerPorts(broker_port, controller_port)


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


# ----------------------------------------------------------------------------- OS helpers


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


# ----------------------------------------------------------------------------- the broker


class LocalBroker:
    """One broker for one data dir. Lifecycle: configure (validate), start, stop; status.

    A node of a LocalCluster (codeclog.devtools.cluster) is a subclass that overrides the `_node_*`
    hooks: its node id, fixed ports, properties and format mode.
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
        holds = security.SECURITY_SCRAM if self.security_files.complete() else None
        if not formatted:
            return self.settings.security or security.SECURITY_NONE
        held = holds or security.SECURITY_NONE
        if self.settings.security is not None and self.settings.security != held:
            raise SecurityModeError(
                f"{self.data_dir} holds a broker formatted with --security {held}; it cannot "
                f"start with --security {self.settings.security} (users are created at format "
                "time): use another --data-dir"
            )
        return held

    def admin_client_config(self) -> dict[str, str]:
        """Client properties of the super user (empty for a plaintext broker)."""
        creds = self._credentials
        if creds is None:
            return {}
        props = security.client_properties(
            security.SUPER_USER, creds.password(security.SUPER_USER), "", self.security_files.ca_pem
        )
        props.pop("bootstrap.servers")
        return props

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
        try:
            with self.log_path.open("rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - 256 * 1024))
                text = log.read().decode("utf-8", "replace")
        except OSError:
            return ""
        text = text[text.rfind(START_BANNER) :] if START_BANNER in text else text
        return "\n".join(text.splitlines()[-max_lines:])

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
            return _read_cluster_id(meta)
        cluster_id = self._node_cluster_id()
        progress(f"formatting {self.log_dirs} (cluster id {cluster_id})")
        command = [
            java,
            "-Xmx256m",
            f"-Dlog4j2.configurationFile={runtime_file('tools-log4j2.properties')}",
            "-cp",
            str(libs_dir / "*"),  # a literal *: java expands the classpath wildcard itself
            "kafka.tools.StorageTool",
            "format",
            *self._node_format_args(),
            *(security.scram_format_args(self._credentials) if self._credentials else []),
            "-t",
            cluster_id,
            "-c",
            str(self.properties_path),
        ]
        _run_format(command, self.log_dirs)
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
            _kill_quietly(process)
            raise
        state = BrokerState(
            pid=process.pid,
            broker_port=ports.broker_port,
            controller_port=ports.controller_port,
            bootstrap=bootstrap,
            cluster_id=cluster_id,
            data_dir=str(self.data_dir),
            log_path=str(self.log_path),
            started_at=_iso_utc(self._wall_clock()),
            **self._security_state(bootstrap),
        )
        _write_atomically(self.state_path, state.to_json())
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
        self._rotate_log()
        hook = parent_death_hook() if self.settings.die_with_parent else None
        with self.log_path.open("ab") as log:
            log.write(f"{START_BANNER} at {_iso_utc(self._wall_clock())} ====\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                self._jvm_command(java, libs_dir),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,  # detached: survives the CLI and terminal signals
                preexec_fn=hook,
            )
        return self._process

    def _jvm_command(self, java: str, libs_dir: Path) -> list[str]:
        return [
            java,
            f"-Xms{self.settings.heap_min_mb}m",
            f"-Xmx{self.settings.heap_max_mb}m",
            # Kafka's own launcher flags (kafka-run-class.sh).
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent",
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={self.data_dir}",
            f"-Dlog4j2.configurationFile={runtime_file('log4j2.properties')}",
            *self.settings.extra_jvm_args,
            "-cp",
            str(libs_dir / "*"),
            "kafka.Kafka",
            str(self.properties_path),
        ]

    def _wait_ready(
        self, process: subprocess.Popen[bytes], port: int, bootstrap: str, deadline: float
    ) -> None:
        while True:
            code = process.poll()
            if code is not None:
                raise self._exit_error(code)
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

    def _exit_error(self, code: int) -> BrokerStartError:
        # The cause is often a screenful above the end: search a long tail, show a short one.
        long_tail = self.log_tail(max_lines=400)
        short_tail = "\n".join(long_tail.splitlines()[-40:])
        if "Address already in use" in long_tail:
            return PortInUseError("a broker port was taken by another process", short_tail)
        return BrokerStartError(
            f"the Kafka broker exited during start-up with code {code} (log {self.log_path}): "
            f"{telling_line(long_tail)}",
            short_tail,
        )

    def _rotate_log(self) -> None:
        with contextlib.suppress(OSError):
            if self.log_path.stat().st_size > LOG_ROTATE_BYTES:
                self.log_path.replace(self.log_path.with_name(LOG_FILE + ".1"))

    # stop internals ------------------------------------------------------------------------
    def _terminate(self, pid: int) -> StopResult:
        started = self._clock()
        _signal(pid, signal.SIGTERM)
        exit_code, exited = self._wait_exit(pid, self.settings.stop_timeout_s)
        forced = not exited
        if forced:
            _signal(pid, signal.SIGKILL)
            exit_code, _ = self._wait_exit(pid, KILL_WAIT_S)
        return StopResult(True, forced, self._clock() - started, exit_code)

    def _wait_exit(self, pid: int, timeout_s: float) -> tuple[int | None, bool]:
        """(exit code if known, exited?) after waiting up to timeout_s."""
        if self._process is not None and self._process.pid == pid:
            try:
                return self._process.wait(timeout=timeout_s), True
            except subprocess.TimeoutExpired:
                return None, False
        deadline = self._clock() + timeout_s
        while pid_runs_broker(pid, self.properties_path):
            if self._clock() > deadline:
                return None, False
            time.sleep(POLL_INTERVAL_S)
        return None, True

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


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` (created if missing) for the block: one CLI at a time."""
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run_format(command: list[str], log_dirs: Path) -> None:
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


def _read_cluster_id(meta: Path) -> str:
    for line in meta.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "cluster.id":
            return value.strip()
    raise BrokerFormatError(f"{meta} has no cluster.id; delete the data dir and start again")


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _kill_quietly(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        process.kill()
        process.wait(timeout=KILL_WAIT_S)


def _write_atomically(path: Path, text: str) -> None:
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(text)
    temp.replace(path)


def _iso_utc(unix_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(unix_s, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="seconds")
