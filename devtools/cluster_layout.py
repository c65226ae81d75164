"""What a local cluster's cluster.json holds, fixed for the life of its data dir: the cluster id,
every node's two ports (the static controller quorum) and, for a faultable cluster, each node's
proxies (codeclog.devtools.links); and the server.properties every node renders from it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from codeclog.devtools.broker_config import BrokerPorts, node_settings, plaintext_listeners
from codeclog.devtools.host import HOST, pick_free_port
from codeclog.devtools.links import LISTENERS, LinkUsageError, NodeLinks, listener_properties
from codeclog.kafka.topics import replication_for

# Internal topics: few partitions keep a 2-core box responsive; more than one so that the
# group and transaction coordinators of different ids can sit on different nodes.
INTERNAL_PARTITIONS = 3


@dataclasses.dataclass(frozen=True)
class ClusterLayout:
    """What cluster.json holds: fixed for the life of the data dir. A faultable cluster's
    `ports` are its proxies' (clients and controller): the addresses every client and node
    uses; `links` hold each node's proxies and real ports (codeclog.devtools.links)."""

    cluster_id: str
    ports: tuple[BrokerPorts, ...]  # ports[i] belongs to node i + 1
    links: tuple[NodeLinks, ...] = ()  # faultable only
    toxiproxy_api: int = 0  # faultable only: the Toxiproxy API port

    @property
    def faultable(self) -> bool:
        return bool(self.links)

    def node_links(self, node_id: int) -> NodeLinks:
        if not self.faultable:
            raise LinkUsageError(
                "this cluster was not started faultable: its links cannot fail (start a new one "
                "with `codeclog broker start --nodes 3 --faultable --data-dir DIR`)"
            )
        if node_id not in self.node_ids:
            raise LinkUsageError(f"the cluster has nodes 1..{self.nodes}, not node {node_id}")
        return self.links[node_id - 1]

    def link_bootstrap(self, link: str) -> str:
        """The bootstrap of a client link ("clients": the cluster's; "member", "talker")."""
        if link == "clients" or not self.faultable:
            return self.bootstrap
        listener = {"member": "MEMBER", "talker": "TALKER"}[link]
        return ",".join(f"{HOST}:{n.advertised(listener)}" for n in self.links)

    @property
    def nodes(self) -> int:
        return len(self.ports)

    @property
    def node_ids(self) -> range:
        return range(1, self.nodes + 1)

    def node_ports(self, node_id: int) -> BrokerPorts:
        return self.ports[node_id - 1]

    @property
    def voters(self) -> str:
        return ",".join(
            f"{node}@{HOST}:{self.node_ports(node).controller_port}" for node in self.node_ids
        )

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{HOST}:{ports.broker_port}" for ports in self.ports)

    def to_json(self) -> str:
        raw: dict[str, Any] = {
            "cluster_id": self.cluster_id,
            "nodes": [
                {
                    "node_id": node,
                    "broker_port": p.broker_port,
                    "controller_port": p.controller_port,
                }
                for node, p in zip(self.node_ids, self.ports, strict=True)
            ],
        }
        if self.faultable:
            raw["faultable"] = {
                "toxiproxy_api": self.toxiproxy_api,
                "links": {str(n.node_id): n.to_json() for n in self.links},
            }
        return json.dumps(raw, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterLayout:
        raw: Any = json.loads(text)
        nodes = sorted(raw["nodes"], key=lambda node: int(node["node_id"]))
        if [int(node["node_id"]) for node in nodes] != list(range(1, len(nodes) + 1)):
            raise ValueError("node ids must be 1..N")
        ports = tuple(
            BrokerPorts(int(node["broker_port"]), int(node["controller_port"])) for node in nodes
        )
        faultable = raw.get("faultable")
        if not faultable:
            return cls(str(raw["cluster_id"]), ports)
        links = tuple(
            NodeLinks.from_json(n, faultable["links"][str(n)]) for n in range(1, len(ports) + 1)
        )
        return cls(str(raw["cluster_id"]), ports, links, int(faultable["toxiproxy_api"]))

    @classmethod
    def fresh(
        cls,
        nodes: int,
        cluster_id: str,
        pick: Callable[[], int] = pick_free_port,
        faultable: bool = False,
    ) -> ClusterLayout:
        taken: set[int] = set()

        def distinct() -> int:
            while (port := pick()) in taken:
                pass
            taken.add(port)
            return port

        if not faultable:
            ports = tuple(BrokerPorts(distinct(), distinct()) for _ in range(nodes))
            return cls(cluster_id, ports)
        links = tuple(
            NodeLinks(node, {name: (distinct(), distinct()) for name in LISTENERS})
            for node in range(1, nodes + 1)
        )
        ports = tuple(
            BrokerPorts(n.advertised("CLIENTS"), n.advertised("CONTROLLER")) for n in links
        )
        return cls(cluster_id, ports, links, distinct())


def render_cluster_properties(
    layout: ClusterLayout, node_id: int, log_dirs: Path, secured: dict[str, str] | None = None
) -> str:
    """server.properties for node `node_id` of the cluster (static controller quorum).
    `secured` (codeclog.devtools.security.server_security_properties) replaces the listeners."""
    ports = layout.node_ports(node_id)
    replication, min_isr = replication_for(layout.nodes)
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        # Static voters, formatted without --standalone: every node knows the whole quorum,
        # so the ports must never change (they live in cluster.json).
        "controller.quorum.voters": layout.voters,
        **(
            listener_properties(layout.node_links(node_id))
            if layout.faultable
            else plaintext_listeners(ports)
        ),
        "log.dirs": str(log_dirs),
        **node_settings(replication, min_isr, INTERNAL_PARTITIONS),
        "unclean.leader.election.enable": "false",
        "num.replica.fetchers": "1",
        **(secured or {}),
    }
    lines = ["# written by codeclog at every start of this node; edits are overwritten"]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"
