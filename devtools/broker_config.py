"""A local Kafka node's configuration: its two ports (kept between starts while they are free),
its cluster id and its server.properties. Nothing here does I/O but through what a caller
hands in (a port probe, random bytes).
"""

from __future__ import annotations

import dataclasses
import os
import re
from base64 import urlsafe_b64encode
from collections.abc import Callable
from pathlib import Path

from codeclog.devtools.host import HOST

NODE_ID = 1


@dataclasses.dataclass(frozen=True)
class BrokerPorts:
    broker_port: int  # PLAINTEXT listener, the bootstrap port
    controller_port: int  # KRaft CONTROLLER listener


def new_cluster_id(random_bytes: Callable[[int], bytes] = os.urandom) -> str:
    """Kafka's Uuid.toString(): 22 url-safe base64 chars; never starting with '-' (argparse)."""
    while True:
        cluster_id = urlsafe_b64encode(random_bytes(16)).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def render_server_properties(
    ports: BrokerPorts, log_dirs: Path, secured: dict[str, str] | None = None
) -> str:
    """server.properties for one combined node (docs/local-kafka.md has what each setting is for).
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
