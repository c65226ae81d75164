"""A faultable cluster's links against a real Toxiproxy server (scripts/bootstrap.sh builds it),
with no Kafka node running: `broker net` keeps a link's faults when a call fails, `status`
checks Toxiproxy and its proxies, and a faultable start that fails stops the Toxiproxy it
started. The last test runs real JVMs: a start that times out names the timeout given."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from codeclog.cli import main
from codeclog.devtools.broker import BrokerSettings
from codeclog.devtools.cluster import LocalCluster
from codeclog.devtools.cluster_layout import ClusterLayout
from codeclog.devtools.host import tcp_accepts
from codeclog.devtools.links import Toxiproxy


def _cluster_dir(folder: Path) -> LocalCluster:
    """A faultable 3-node cluster's data dir (cluster.json only: no node ever started)."""
    folder.mkdir()
    layout = ClusterLayout.fresh(3, "AAAAAAAAAAAAAAAAAAAAAA", faultable=True)
    (folder / "cluster.json").write_text(layout.to_json())
    return LocalCluster(folder)


@pytest.fixture
def links(tmp_path: Path) -> Iterator[LocalCluster]:
    """That data dir with its Toxiproxy running and every proxy made (stopped at the end)."""
    cluster = _cluster_dir(tmp_path / "f3")
    toxiproxy = cluster.toxiproxy()
    toxiproxy.start(cluster.layout().links)
    try:
        yield cluster
    finally:
        toxiproxy.stop()


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["broker", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _types(toxiproxy: Toxiproxy, proxy: str) -> list[str]:
    return sorted(toxic["type"] for toxic in toxiproxy.toxics(proxy))


def test_a_net_call_that_fails_leaves_the_link_as_it_was(
    links: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--data-dir", str(links.data_dir)]
    toxiproxy = links.toxiproxy()
    assert _cli(capsys, "net", "--node", "1", "--link", "peers", "--down", *where)[0] == 0
    # too large for Toxiproxy's JSON (int64): refused up front, the link still down
    code, _, err = _cli(
        capsys, "net", "--node", "1", "--link", "peers", "--latency-ms", str(10**19), *where
    )
    assert code == 2 and err.count("\n") == 1 and "at most" in err, err
    assert _types(toxiproxy, "n1-replication") == ["timeout", "timeout"]
    # a call Toxiproxy refuses half-way (one of the link's two proxies is gone): one readable
    # line, exit 1, and the proxy it had changed gets its faults back
    toxiproxy.api("DELETE", "/proxies/n1-controller")
    code, _, err = _cli(
        capsys, "net", "--node", "1", "--link", "peers", "--latency-ms", "100", *where
    )
    assert code == 1 and err.count("\n") == 1, err
    assert "proxy not found" in err and "{" not in err, err  # Toxiproxy's reason, not its JSON
    assert "node 1, link peers" in err and "the link keeps the faults it had" in err, err
    assert _types(toxiproxy, "n1-replication") == ["timeout", "timeout"]


def test_status_checks_toxiproxy_and_its_proxies(
    links: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    toxiproxy = links.toxiproxy()
    status = links.links_status()
    assert status is not None and status.pid is not None and status.problems == ()
    toxiproxy.api("DELETE", "/proxies/n2-talker")
    status = links.links_status()
    assert status is not None and len(status.problems) == 1
    assert "lacks the proxies n2-talker" in status.problems[0]
    # every node stopped while Toxiproxy runs: what a failed start used to leave behind
    code, out, _ = _cli(capsys, "status", "--data-dir", str(links.data_dir))
    assert code == 1 and "still runs though every node is stopped" in out, out
    os.kill(status.pid, signal.SIGKILL)
    _wait_gone(toxiproxy)
    status = links.links_status()
    assert status is not None and status.pid is None
    assert status.problems and "Toxiproxy is not running" in status.problems[0]
    code, out, _ = _cli(capsys, "status", "--data-dir", str(links.data_dir))
    assert code == 3 and "stopped (Toxiproxy not running)" in out, out


def _wait_gone(toxiproxy: Toxiproxy) -> None:
    for _ in range(100):
        if toxiproxy.running_pid() is None:
            return
        time.sleep(0.05)
    raise AssertionError("Toxiproxy outlived SIGKILL")


def test_a_failed_faultable_start_stops_the_toxiproxy_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Toxiproxy and its proxies come first, then java is looked for: missing, the start fails
    monkeypatch.setenv("CODECLOG_JAVA", str(tmp_path / "no-java"))
    data_dir = tmp_path / "f3"
    try:
        code, _, err = _cli(
            capsys, "start", "--nodes", "3", "--faultable", "--data-dir", str(data_dir)
        )
        errors = [line for line in err.splitlines() if line.startswith("codeclog broker")]
        assert code != 0 and len(errors) == 1 and "no-java" in errors[0], err
        layout = ClusterLayout.from_json((data_dir / "cluster.json").read_text())
        assert not tcp_accepts(layout.toxiproxy_api)  # nothing left listening
        assert not (data_dir / "toxiproxy.json").exists()
        code, out, _ = _cli(capsys, "status", "--data-dir", str(data_dir))
        assert code == 3 and "stopped (Toxiproxy not running)" in out, out
    finally:
        _stop_left_over(data_dir)


def _stop_left_over(data_dir: Path) -> None:
    """Whatever a failing run of the code under test left behind."""
    try:
        pid = int(json.loads((data_dir / "toxiproxy.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.kafka
@pytest.mark.slow
def test_a_faultable_start_that_times_out_names_the_timeout_given_and_stops_its_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The controller quorum meets through the peers links: with every one of them down no
    # node can become ready, whatever the machine. Toxiproxy runs before the start (this test
    # started it), so the start leaves it running.
    links = _cluster_dir(tmp_path / "f3")
    toxiproxy = links.toxiproxy()
    toxiproxy.start(links.layout().links)
    try:
        for node in links.layout().node_ids:
            assert _cli(capsys, "net", "--node", str(node), "--link", "peers", "--down",
                        "--data-dir", str(links.data_dir))[0] == 0  # fmt: skip
        code, _, err = _cli(
            capsys, "start", "--timeout-s", "2", "--heap-max-mb", "256",
            "--data-dir", str(links.data_dir),
        )  # fmt: skip
        assert code == 1 and "did not become ready within 2 s" in err, err
        assert {s.kind.value for s in links.status()} == {"stopped"}
        assert toxiproxy.running_pid() is not None
    finally:
        LocalCluster(links.data_dir, settings=BrokerSettings(stop_timeout_s=5)).stop()
        toxiproxy.stop()
        _stop_left_over(links.data_dir)
