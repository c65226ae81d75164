"""Links that can fail: the traffic of a faultable local cluster runs through Toxiproxy.

`codeclog broker start --nodes 3 --faultable` puts every node's traffic behind a proxy of its
own, one per link, so that one node's link can be cut or slowed while everything else runs:

- `clients`: what the consumer members, readers and admin tools send to the node (a listener
  of its own, CLIENTS, advertised at the proxy);
- `member`: the same for one consumer member that is to be faulted alone (listener MEMBER: give
  that member this link's bootstrap);
- `talker`: what the talker (the producer of codec chunks) sends to the node (listener TALKER);
- `peers`: what the other nodes send to it: replication fetches (listener REPLICATION, the
  inter-broker listener) and the controller quorum's Raft traffic (CONTROLLER; the static
  voters name the proxies).

A node advertises the proxies' addresses, so a client that learned the cluster's metadata keeps
going through them (a client that reached the real port would reconnect around the proxy).
Cutting a link cuts what flows INTO the node on it; the node's own requests to the others go
through their links. Faults (Toxiproxy toxics, both directions unless named): `latency` with
jitter, `down` (a black hole: the connection stays open, nothing passes), `reset` (connections
reset after a few ms), removed by `heal`.

Toxiproxy (github.com/Shopify/toxiproxy, version TOXIPROXY_VERSION) is built by
scripts/bootstrap.sh with `go install` into the cache; `find_server` finds it. The server runs
beside the nodes for the life of the cluster (`toxiproxy.json` in the cluster's data dir).
Only loopback addresses are used.
"""

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

from codeclog.devtools.broker import HOST, pid_exists, tcp_accepts
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
API_TIMEOUT_S = 5.0


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
        try:
            pid = int(json.loads(self.state_path.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return pid if pid_exists(pid) and tcp_accepts(self.api_port) else None

    def start(self, nodes: Iterable[NodeLinks]) -> None:
        """Start the server if it is not running, then make every proxy (idempotent)."""
        if self.running_pid() is None:
            server = find_server()
            log = (self.data_dir / "toxiproxy.log").open("ab")
            process = subprocess.Popen(
                [str(server), "-host", HOST, "-port", str(self.api_port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.state_path.write_text(json.dumps({"pid": process.pid, "api": self.api_port}))
            deadline = time.monotonic() + START_TIMEOUT_S
            while not tcp_accepts(self.api_port):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise LinkError(
                        f"Toxiproxy did not start on {HOST}:{self.api_port}; see "
                        f"{self.data_dir / 'toxiproxy.log'}"
                    )
                time.sleep(0.1)
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

    def stop(self) -> None:
        pid = self.running_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
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
        self.api("POST", f"/proxies/{proxy}/toxics", body)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://{HOST}:{self.api_port}{path}", data=data, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=API_TIMEOUT_S) as response:
                text = response.read().decode() or "null"
        except urllib.error.HTTPError as exc:
            raise LinkError(f"Toxiproxy {method} {path}: {exc.code} {exc.read().decode()}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise LinkError(
                f"Toxiproxy does not answer on {HOST}:{self.api_port} ({exc}): is the cluster "
                "started (`codeclog broker start`)?"
            ) from exc
        return json.loads(text)


# ----------------------------------------------------------------------------- faults


@dataclasses.dataclass(frozen=True)
class Fault:
    """What to do to a link: latency (with jitter), down, reset, or heal (None)."""

    kind: str | None  # "latency", "down", "reset"; None: heal
    latency_ms: int = 0
    jitter_ms: int = 0

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
    """Replace whatever the proxies do with `fault` (heal: nothing)."""
    for proxy in proxies:
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
