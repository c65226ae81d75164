"""What `codeclog broker status` and `codeclog broker net` print: a broker's status, a local
cluster's nodes and its links' line, each link's faults."""

from __future__ import annotations

from pathlib import Path

from codeclog.devtools.broker import BrokerStatus
from codeclog.devtools.cluster import LinksStatus, NodeStatus, NodeStatusKind


def format_status(status: BrokerStatus) -> str:
    """One broker's `status`: a `key: value` line each."""
    state = status.state
    rows = [("status", status.kind.value)]
    if state is not None:
        rows += [("pid", str(state.pid)), ("bootstrap", state.bootstrap)]
        rows += [("cluster id", state.cluster_id), ("started at", state.started_at)]
    rows += [("data dir", str(status.data_dir)), ("log", str(status.log_path))]
    return "\n".join(f"{key + ':':<12}{value}" for key, value in rows)


def format_cluster_status(
    statuses: tuple[NodeStatus, ...], cluster_id: str, bootstrap: str, data_dir: Path
) -> str:
    """A cluster's `status`: its id, bootstrap and data dir, then a row per node."""
    rows = [("NODE", "STATUS", "PID", "BROKER", "CONTROLLER", "LOG")]
    for s in statuses:
        pid = (
            str(s.broker.state.pid)
            if s.broker.state and s.kind is not NodeStatusKind.STOPPED
            else "-"
        )
        rows.append(
            (
                str(s.node_id),
                s.kind.value,
                pid,
                str(s.ports.broker_port),
                str(s.ports.controller_port),
                str(s.broker.log_path),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [
        f"{'cluster id:':<12}{cluster_id}",
        f"{'bootstrap:':<12}{bootstrap}",
        f"{'data dir:':<12}{data_dir}",
    ]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True)))
        lines[-1] += "  " + row[5]
    return "\n".join(lines)


def format_links_status(links: LinksStatus, stopped: bool) -> tuple[str, bool]:
    """The `links:` line of a faultable cluster's status, and whether it is as it should be:
    Toxiproxy with every proxy while nodes run, nothing when every node is stopped."""
    if stopped:
        if links.pid is None:
            return "stopped (Toxiproxy not running)", True
        return (
            f"Toxiproxy (pid {links.pid}) still runs though every node is stopped; "
            "`codeclog broker stop` ends it",
            False,
        )
    if links.problems:
        return (
            f"UNREACHABLE: {'; '.join(links.problems)}: no client reaches the nodes; "
            "`codeclog broker start` brings Toxiproxy and its proxies back",
            False,
        )
    return f"through Toxiproxy (pid {links.pid}, API {links.api}), every proxy in place", True


def format_links(faults: dict[tuple[int, str], list[str]]) -> str:
    """`net`'s table: a row per node and link, its faults or "healthy"."""
    rows = [("NODE", "LINK", "FAULT")]
    rows += [
        (str(node), link, "; ".join(toxics) or "healthy")
        for (node, link), toxics in sorted(faults.items())
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    return "\n".join(
        f"{row[0].ljust(widths[0])}  {row[1].ljust(widths[1])}  {row[2]}" for row in rows
    )
