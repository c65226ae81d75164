"""The local cluster without JVMs: layout, properties, status of a stopped cluster, the CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from codeclog.cli import main
from codeclog.devtools.broker_config import BrokerPorts
from codeclog.devtools.broker_errors import ClusterError
from codeclog.devtools.cluster import LocalCluster, NodeStatusKind, local_bootstrap
from codeclog.devtools.cluster_layout import ClusterLayout, render_cluster_properties
from codeclog.devtools.host import process_is_stopped


def _layout() -> ClusterLayout:
    return ClusterLayout(
        "abc", (BrokerPorts(1001, 2001), BrokerPorts(1002, 2002), BrokerPorts(1003, 2003))
    )


def test_properties_make_a_three_voter_quorum_with_rf3_and_min_isr2(tmp_path: Path) -> None:
    text = render_cluster_properties(_layout(), 2, tmp_path / "kafka")
    props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:2001,2@127.0.0.1:2002,3@127.0.0.1:2003"
    )
    assert "controller.quorum.bootstrap.servers" not in props
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:1002,CONTROLLER://127.0.0.1:2002"
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "default.replication.factor",
    ):
        assert props[key] == "3", key
    assert props["transaction.state.log.min.isr"] == "2"
    assert props["min.insync.replicas"] == "2"
    assert props["unclean.leader.election.enable"] == "false"


def test_layout_round_trips_and_fresh_ports_are_distinct() -> None:
    layout = _layout()
    assert ClusterLayout.from_json(layout.to_json()) == layout
    assert layout.bootstrap == "127.0.0.1:1001,127.0.0.1:1002,127.0.0.1:1003"
    picks = iter([5, 5, 6, 7, 7, 8, 9, 10])
    fresh = ClusterLayout.fresh(3, "x", pick=lambda: next(picks))
    ports = [p for pair in fresh.ports for p in (pair.broker_port, pair.controller_port)]
    assert ports == [5, 6, 7, 8, 9, 10]


def test_a_stopped_cluster_is_stopped_and_has_no_bootstrap(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text(_layout().to_json())
    cluster = LocalCluster(tmp_path)
    assert [s.kind for s in cluster.status()] == [NodeStatusKind.STOPPED] * 3
    assert local_bootstrap(tmp_path) is None
    with pytest.raises(ClusterError, match="not running"):
        cluster.kill(2)
    with pytest.raises(ClusterError, match=r"nodes 1\.\.3, not node 4"):
        cluster.node(4)
    assert main(["broker", "status", "--data-dir", str(tmp_path)]) == 3


def test_sizes_and_single_node_dirs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match=r"2\.\.9 nodes"):
        LocalCluster(tmp_path, 1)
    (tmp_path / "broker.json").write_text("{}")
    with pytest.raises(ClusterError, match="single-node broker"):
        LocalCluster(tmp_path, 3).start()


@pytest.mark.parametrize("action", ["kill", "pause", "resume", "restart"])
def test_node_actions_need_a_cluster(
    action: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A usage error, exit 2, as `net` says for the same mistake (issue 41: it was exit 1)."""
    assert main(["broker", action, "--node", "1", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds no local cluster" in err and err.count("\n") == 1, err


def test_help_states_the_memory(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["broker", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--nodes 3" in out and "128..512 MiB" in out and "24 GB" in out


def test_process_is_stopped_reads_proc() -> None:
    assert not process_is_stopped(os.getpid())
