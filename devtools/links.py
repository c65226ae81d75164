"""Links that can fail: the traffic of a faultable local cluster runs through Toxiproxy, one proxy
per listener of every node. Links, faults and why: docs/local-kafka.md, "Network faults"."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from codeclog.devtools.host import HOST, pid_exists, tcp_accepts
from codeclog.errors import CodeclogError, UsageError
from codeclog.paths import default_cache_dir as cache_dir

TOXIPROXY_VERSION = "2.5.0"
TOXIPROXY_ENV = "CODECLOG_TOXIPROXY"  # the server binary, if not in the cache or on PATH
STATE_FILE = "toxiproxy.json"
LINKS = ("clients", "member", "talker", "peers")
# listener -> the link it belongs to (the peers link has two listeners)
LISTENERS = {
    "CLIENTS": "clients",
    "MEMBER": "member",
    "TALKER": "talker",
    "REPLICATION": "peers",
    "CONTROLLER": "peers",
}
START_TIMEOUT_S = 10.0
STOP_WAIT_S = 5.0
ANSWER_TIMEOUT_S = 5.0  # "is it up": a start or a status waits in steps this long
# A call of its API: Toxiproxy takes a proxy's lock for every call, and a link busy with traffic
# can hold it seconds under load (a CI run: a first GET of the toxics timed out after 5 s, the
# 2-core machine running three nodes, two members and the decoder); a read is tried again.
API_TIMEOUT_S = 15.0
API_READ_TRIES = 3
# Toxiproxy turns milliseconds into a Go time.Duration (int64 nanoseconds): a latency plus its
# jitter above this (about 292 years) wraps around. Toxiproxy accepts such a toxic all the same
# (up to 2**63 - 1 ms) and delays by what is left: measured with 2.5.0, none at one ms past
# this, none at 1e13 ms, and some (over 3 s) at 1e15 ms.
MAX_LATENCY_MS = (2**63 - 1) // 1_000_000


class LinkError(CodeclogError):
    """Toxiproxy could not be started or answered an error."""


class LinkUsageError(LinkError, UsageError):
    """A missing tool, a cluster that is not faultable, an unknown node or link: exit 2."""


def find_server() -> Path:
    """The toxiproxy-server binary: $CODECLOG_TOXIPROXY, the bootstrap's cache, or PATH."""
    candidates = [
        os.environ.get(TOXIPROXY_ENV, ""),
        str(cache_dir() / f"toxiproxy-{TOXIPROXY_VERSION}" / "server"),
        shutil.which("toxiproxy-server") or "",
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise LinkUsageError(
        "a faultable cluster needs Toxiproxy, which is not installed: run scripts/bootstrap.sh "
        f"(it builds Toxiproxy {TOXIPROXY_VERSION} with `go install` into "
        f"{cache_dir() / f'toxiproxy-{TOXIPROXY_VERSION}'}), or set ${TOXIPROXY_ENV}"
    )


@dataclasses.dataclass(frozen=True)
class NodeLinks:
    """One node's proxies: listener name -> (the proxy's port, the node's real port)."""

    node_id: int
    ports: Mapping[str, tuple[int, int]]

    def proxy(self, listener: str) -> str:
        return f"n{self.node_id}-{listener.lower()}"

    def proxies(self, link: str) -> list[str]:
        return [self.proxy(name) for name, owner in LISTENERS.items() if owner == link]

    def real(self, listener: str) -> int:
        return self.ports[listener][1]

    def advertised(self, listener: str) -> int:
        return self.ports[listener][0]

    def to_json(self) -> dict[str, Any]:
        return {name: list(pair) for name, pair in self.ports.items()}

    @classmethod
    def from_json(cls, node_id: int, raw: Mapping[str, Any]) -> NodeLinks:
        ports = {name: (int(raw[name][0]), int(raw[name][1])) for name in LISTENERS}
        return cls(node_id, ports)


def listener_properties(links: NodeLinks) -> dict[str, str]:
    """A faultable node's listeners: each binds its real port and advertises its proxy."""
    real = ",".join(f"{name}://{HOST}:{links.real(name)}" for name in LISTENERS)
    advertised = ",".join(
        f"{name}://{HOST}:{links.advertised(name)}" for name in LISTENERS if name != "CONTROLLER"
    )
    return {
        "listeners": real,
        "advertised.listeners": advertised,
        "inter.broker.listener.name": "REPLICATION",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": ",".join(f"{name}:PLAINTEXT" for name in LISTENERS),
    }


# ----------------------------------------------------------------------------- the server


class Toxiproxy:
    """The Toxiproxy server of one cluster data dir, and its HTTP API on 127.0.0.1."""

    def __init__(self, data_dir: Path, api_port: int) -> None:
        self.data_dir = data_dir
        self.api_port = api_port

    @property
    def state_path(self) -> Path:
        return self.data_dir / STATE_FILE

    def running_pid(self) -> int | None:
        """The server's pid while it runs and its API answers, else None."""
        pid = self._server_pid()
        return pid if pid is not None and tcp_accepts(self.api_port) else None

    def _server_pid(self) -> int | None:
        """The recorded pid while that process is this server (its command line names the API
        port: a pid reused by another process is not ours to signal), else None."""
        try:
            pid = int(json.loads(self.state_path.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)  # our own child that ended: reap it
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            if Path("/proc/self/cmdline").exists():
                return None
            return pid if pid_exists(pid) else None  # no procfs (macOS): the best check there
        if not cmdline:  # exiting (its memory is gone, its sockets may not be yet) or a zombie
            return pid
        return pid if f"\0-port\0{self.api_port}\0".encode() in b"\0" + cmdline else None

    def start(self, nodes: Iterable[NodeLinks]) -> bool:
        """Start the server if it is not running, then make every proxy (idempotent). True when
        this call started the server (a caller whose start fails later stops it again)."""
        started = self.running_pid() is None
        if started:
            self._spawn()
        try:
            existing = self.api("GET", "/proxies")
            for node in nodes:
                for listener, (proxy_port, real_port) in node.ports.items():
                    name = node.proxy(listener)
                    if name not in existing:
                        body = {
                            "name": name,
                            "listen": f"{HOST}:{proxy_port}",
                            "upstream": f"{HOST}:{real_port}",
                        }
                        self.api("POST", "/proxies", body)
        except BaseException:
            if started:
                self.stop()
            raise
        return started

    def _spawn(self) -> None:
        server = find_server()
        with (self.data_dir / "toxiproxy.log").open("ab") as log:
            process = subprocess.Popen(
                [str(server), "-host", HOST, "-port", str(self.api_port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.state_path.write_text(json.dumps({"pid": process.pid, "api": self.api_port}))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():  # its HTTP API, not only its port: a fresh server may reset
            if process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise LinkError(
                    f"Toxiproxy did not start on {HOST}:{self.api_port}; see "
                    f"{self.data_dir / 'toxiproxy.log'}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM the server, SIGKILL it if it is still there after STOP_WAIT_S; wait until
        it is gone."""
        pid = self._server_pid()
        if pid is not None:
            for signum, wait_s in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, STOP_WAIT_S)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
                deadline = time.monotonic() + wait_s
                while self._server_pid() is not None and time.monotonic() < deadline:
                    time.sleep(0.05)
                if self._server_pid() is None:
                    break
        with contextlib.suppress(OSError):
            self.state_path.unlink()

    # faults -----------------------------------------------------------------------------
    def toxics(self, proxy: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.api("GET", f"/proxies/{proxy}/toxics")
        return found

    def heal(self, proxy: str) -> None:
        for toxic in self.toxics(proxy):
            self.api("DELETE", f"/proxies/{proxy}/toxics/{toxic['name']}")

    def add(self, proxy: str, kind: str, attributes: dict[str, int], stream: str) -> None:
        body = {
            "name": f"{kind}-{stream}",
            "type": kind,
            "stream": stream,
            "attributes": attributes,
        }
        self.add_toxic(proxy, body)

    def add_toxic(self, proxy: str, toxic: Mapping[str, Any]) -> None:
        """One toxic as Toxiproxy lists it (name, type, stream, toxicity, attributes)."""
        self.api("POST", f"/proxies/{proxy}/toxics", dict(toxic))

    def _answers(self) -> bool:
        """Toxiproxy's API answers a request (GET /version)."""
        if not tcp_accepts(self.api_port):
            return False
        try:
            with urllib.request.urlopen(
                f"http://{HOST}:{self.api_port}/version", timeout=ANSWER_TIMEOUT_S
            ) as response:
                response.read()
        except (urllib.error.URLError, OSError):
            return False
        return True

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """One call of Toxiproxy's API; a read that times out is tried again (API_READ_TRIES),
        a change never (it may have happened)."""
        tries = API_READ_TRIES if method == "GET" else 1
        for attempt in range(1, tries + 1):
            try:
                return self._call(method, path, body)
            except LinkError as exc:
                if attempt == tries or not _timed_out(exc.__cause__):
                    raise
        raise AssertionError("unreachable")

    def _call(self, method: str, path: str, body: Any) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://{HOST}:{self.api_port}{path}", data=data, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=API_TIMEOUT_S) as response:
                text = response.read().decode() or "null"
        except urllib.error.HTTPError as exc:
            raise LinkError(
                f"Toxiproxy refused {method} {path} ({exc.code}: {_reason(exc.read())})"
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise LinkError(
                f"Toxiproxy does not answer on {HOST}:{self.api_port} ({exc}): is the cluster "
                "started (`codeclog broker start`)?"
            ) from exc
        return json.loads(text)

    def problems(self, names: Iterable[str]) -> list[str]:
        """Why clients cannot reach the nodes through the proxies `names`: Toxiproxy not
        running, or proxies missing or disabled ([] when every one is there)."""
        pid = self.running_pid()
        if pid is None:
            return [f"Toxiproxy is not running (its API {HOST}:{self.api_port} does not answer)"]
        try:
            existing: dict[str, Any] = self.api("GET", "/proxies")
        except LinkError as exc:
            return [str(exc)]
        missing = [name for name in names if name not in existing]
        disabled = [
            name for name in names if name in existing and not existing[name].get("enabled", True)
        ]
        found = [f"Toxiproxy (pid {pid}) lacks the proxies {', '.join(missing)}"] if missing else []
        if disabled:
            found.append(f"Toxiproxy (pid {pid}) has the proxies {', '.join(disabled)} disabled")
        return found


def _timed_out(exc: BaseException | None) -> bool:
    """urllib's way of saying a call timed out: TimeoutError, or a URLError wrapping one."""
    if isinstance(exc, urllib.error.URLError):
        exc = exc.reason if isinstance(exc.reason, BaseException) else None
    return isinstance(exc, TimeoutError)


def _reason(body: bytes) -> str:
    """Toxiproxy's error body ({"error": ..., "status": ...}) as its sentence."""
    text = body.decode("utf-8", "replace").strip()
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(text)["error"])
    return text or "no reason given"


# ----------------------------------------------------------------------------- faults


@dataclasses.dataclass(frozen=True)
class Fault:
    """What to do to a link: latency (with jitter), down, reset, or heal (None)."""

    kind: str | None  # "latency", "down", "reset"; None: heal
    latency_ms: int = 0
    jitter_ms: int = 0

    def check(self) -> None:
        """LinkUsageError (exit 2) for values Toxiproxy cannot honour: negative, or a latency
        plus jitter past MAX_LATENCY_MS."""
        if self.latency_ms < 0 or self.jitter_ms < 0:
            raise LinkUsageError("--latency-ms and --jitter-ms must be >= 0")
        if self.latency_ms + self.jitter_ms > MAX_LATENCY_MS:
            raise LinkUsageError(
                f"--latency-ms plus --jitter-ms must be at most {MAX_LATENCY_MS} ms (Toxiproxy "
                "counts a delay in 64-bit nanoseconds), not "
                f"{self.latency_ms + self.jitter_ms}"
            )

    def describe(self) -> str:
        if self.kind is None:
            return "healed"
        if self.kind == "latency":
            return f"latency {self.latency_ms} ms +- {self.jitter_ms} ms"
        return {"down": "down (a black hole)", "reset": "connections reset"}[self.kind]


HEAL = Fault(None)
DOWN = Fault("down")
RESET = Fault("reset")


def latency(ms: int, jitter_ms: int = 0) -> Fault:
    return Fault("latency", ms, jitter_ms)


def describe_toxic(toxic: Mapping[str, Any]) -> str:
    """A toxic as `Fault.describe` says it (what `broker net` shows)."""
    attributes = toxic.get("attributes", {})
    kind = {"timeout": "down", "reset_peer": "reset"}.get(str(toxic.get("type")), "latency")
    if kind == "latency":
        return latency(
            int(attributes.get("latency", 0)), int(attributes.get("jitter", 0))
        ).describe()
    return Fault(kind).describe()


def apply(toxiproxy: Toxiproxy, proxies: Iterable[str], fault: Fault) -> None:
    """Replace whatever the proxies do with `fault` (heal: nothing), on all of them or none:
    the fault is checked first, every proxy's toxics are read before any changes (a missing
    proxy fails here), and a failure half-way puts back the toxics each proxy had."""
    fault.check()
    unchanged = "nothing changed: the link keeps the faults it had"
    try:
        before = {proxy: toxiproxy.toxics(proxy) for proxy in proxies}
    except LinkError as exc:
        raise LinkError(f"{exc}; {unchanged}") from exc
    try:
        for proxy in before:
            _replace(toxiproxy, proxy, fault)
    except LinkError as exc:
        try:
            for proxy, toxics in before.items():
                _restore(toxiproxy, proxy, toxics)
        except LinkError as again:
            raise LinkError(f"{exc}; putting back the faults it had failed too: {again}") from exc
        raise LinkError(f"{exc}; {unchanged}") from exc


def _replace(toxiproxy: Toxiproxy, proxy: str, fault: Fault) -> None:
    toxiproxy.heal(proxy)
    if fault.kind == "latency":
        attributes = {"latency": fault.latency_ms, "jitter": fault.jitter_ms}
        for stream in ("upstream", "downstream"):
            toxiproxy.add(proxy, "latency", attributes, stream)
    elif fault.kind == "down":  # timeout 0: nothing passes, the connection stays open
        for stream in ("upstream", "downstream"):
            toxiproxy.add(proxy, "timeout", {"timeout": 0}, stream)
    elif fault.kind == "reset":  # reset_peer: each connection reset after a few ms
        toxiproxy.add(proxy, "reset_peer", {"timeout": 10}, "upstream")


def _restore(toxiproxy: Toxiproxy, proxy: str, toxics: list[dict[str, Any]]) -> None:
    """The proxy's toxics exactly as `toxics` (what Toxiproxy listed) says."""
    toxiproxy.heal(proxy)
    for toxic in toxics:
        toxiproxy.add_toxic(proxy, toxic)
