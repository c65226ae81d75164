"""A faultable cluster without starting one: its layout and properties (every listener on its
real port, every address advertised at its proxy), the faults as Toxiproxy toxics, and the
`broker net` / `broker start --faultable` refusals (one line, exit 2). What a real Toxiproxy
does with them: test_links_toxiproxy.py."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from codeclog.cli import main
from codeclog.cli.broker_tables import format_links_status
from codeclog.devtools.cluster import LinksStatus, LocalCluster
from codeclog.devtools.cluster_layout import ClusterLayout, render_cluster_properties
from codeclog.devtools.links import (
    DOWN,
    HEAL,
    LISTENERS,
    MAX_LATENCY_MS,
    RESET,
    LinkError,
    LinkUsageError,
    apply,
    describe_toxic,
    find_server,
    latency,
)


def _ports() -> Any:
    counter = iter(range(30_000, 31_000))
    return lambda: next(counter)


def test_a_faultable_node_binds_its_real_ports_and_advertises_its_proxies(tmp_path: Path) -> None:
    layout = ClusterLayout.fresh(3, "id", _ports(), faultable=True)
    assert ClusterLayout.from_json(layout.to_json()) == layout
    props = dict(
        line.split("=", 1)
        for line in render_cluster_properties(layout, 2, tmp_path).splitlines()
        if "=" in line
    )
    links = layout.node_links(2)
    for name in LISTENERS:
        assert f"{name}://127.0.0.1:{links.real(name)}" in props["listeners"]
    assert "CONTROLLER" not in props["advertised.listeners"]
    assert f"TALKER://127.0.0.1:{links.advertised('TALKER')}" in props["advertised.listeners"]
    assert props["inter.broker.listener.name"] == "REPLICATION"
    voters = props["controller.quorum.voters"].split(",")  # the quorum meets through proxies
    assert voters[1] == f"2@127.0.0.1:{links.advertised('CONTROLLER')}"
    assert layout.bootstrap.split(",")[1] == f"127.0.0.1:{links.advertised('CLIENTS')}"
    assert layout.link_bootstrap("talker") != layout.link_bootstrap("member") != layout.bootstrap


def test_a_plain_cluster_has_no_links() -> None:
    layout = ClusterLayout.fresh(3, "id", _ports())
    assert not layout.faultable and ClusterLayout.from_json(layout.to_json()) == layout
    with pytest.raises(LinkUsageError, match="not started faultable"):
        layout.node_links(1)


class _Recorded:
    """What `apply` asks of Toxiproxy, kept in a dict; `fail_on` POST number N fails (1-based)
    as Toxiproxy's refusals do (LinkError)."""

    def __init__(self, fail_on: int = 0) -> None:
        self.by_proxy: dict[str, list[dict[str, Any]]] = {}
        self.posts, self.fail_on = 0, fail_on

    def toxics(self, proxy: str) -> list[dict[str, Any]]:
        return list(self.by_proxy.get(proxy, []))

    def heal(self, proxy: str) -> None:
        self.by_proxy[proxy] = []

    def add(self, proxy: str, kind: str, attributes: dict[str, int], stream: str) -> None:
        self.add_toxic(proxy, {"name": f"{kind}-{stream}", "type": kind, "stream": stream,
                               "attributes": attributes})  # fmt: skip

    def add_toxic(self, proxy: str, toxic: dict[str, Any]) -> None:
        self.posts += 1
        if self.posts == self.fail_on:
            raise LinkError(f"Toxiproxy refused POST /proxies/{proxy}/toxics (400: bad body)")
        self.by_proxy.setdefault(proxy, []).append(toxic)


@pytest.mark.parametrize(
    ("fault", "kinds", "shown"),
    [
        (latency(600, 400), ["latency", "latency"], "latency 600 ms +- 400 ms"),
        (DOWN, ["timeout", "timeout"], "down (a black hole)"),
        (RESET, ["reset_peer"], "connections reset"),
        (HEAL, [], ""),
    ],
)
def test_each_fault_is_its_toxics_and_replaces_the_last(
    fault: Any, kinds: list[str], shown: str
) -> None:
    toxiproxy = _Recorded()
    apply(toxiproxy, ["n1-clients"], DOWN)  # type: ignore[arg-type]
    apply(toxiproxy, ["n1-clients"], fault)  # type: ignore[arg-type]
    toxics = toxiproxy.toxics("n1-clients")
    assert [t["type"] for t in toxics] == kinds
    assert {describe_toxic(t) for t in toxics} == ({shown} if shown else set())


@pytest.mark.parametrize("fail_on", [5, 6, 7, 8])  # 4 posts make the down; then the latency's
def test_a_fault_that_fails_half_way_puts_back_what_every_proxy_had(fail_on: int) -> None:
    toxiproxy = _Recorded(fail_on)
    proxies = ["n1-replication", "n1-controller"]  # the peers link: two proxies
    apply(toxiproxy, proxies, DOWN)  # type: ignore[arg-type]
    before = {proxy: toxiproxy.toxics(proxy) for proxy in proxies}
    with pytest.raises(LinkError, match="nothing changed: the link keeps the faults it had"):
        apply(toxiproxy, proxies, latency(100))  # type: ignore[arg-type]
    assert {proxy: toxiproxy.toxics(proxy) for proxy in proxies} == before


def test_a_latency_toxiproxy_cannot_honour_is_refused_before_it_is_asked() -> None:
    toxiproxy = _Recorded()
    apply(toxiproxy, ["n1-clients"], DOWN)  # type: ignore[arg-type]
    for fault in (latency(MAX_LATENCY_MS + 1), latency(MAX_LATENCY_MS, 1), latency(10**19)):
        with pytest.raises(LinkUsageError, match=f"at most {MAX_LATENCY_MS} ms"):
            apply(toxiproxy, ["n1-clients"], fault)  # type: ignore[arg-type]
    assert [t["type"] for t in toxiproxy.toxics("n1-clients")] == ["timeout", "timeout"]
    apply(toxiproxy, ["n1-clients"], latency(MAX_LATENCY_MS - 5, 5))  # type: ignore[arg-type]


def _write_cluster(folder: Path, faultable: bool) -> None:
    folder.mkdir()
    layout = ClusterLayout.fresh(3, "id", _ports(), faultable=faultable)
    (folder / "cluster.json").write_text(layout.to_json())


def _net(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["broker", "net", *args])
    return code, capsys.readouterr().err


def test_net_refuses_what_it_cannot_do_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain, faultable = tmp_path / "plain", tmp_path / "faultable"
    _write_cluster(plain, faultable=False)
    _write_cluster(faultable, faultable=True)
    cases = [
        (["--node", "1", "--link", "peers", "--down", "--data-dir", str(plain)], "not started"),
        (["--node", "7", "--link", "peers", "--down", "--data-dir", str(faultable)], "node 7"),
        (["--node", "1", "--down", "--data-dir", str(faultable)], "--node and its --link"),
        (["--data-dir", str(tmp_path / "none")], "holds no local cluster"),
        (["--node", "1", "--link", "talker", "--jitter-ms", "5", "--data-dir", str(faultable)],
         "--jitter-ms goes with --latency-ms"),
        # Toxiproxy accepts these and delays nothing (its delay is int64 nanoseconds)
        (["--node", "1", "--link", "talker", "--latency-ms", str(MAX_LATENCY_MS + 1),
          "--data-dir", str(faultable)], f"at most {MAX_LATENCY_MS} ms"),
        (["--node", "1", "--link", "talker", "--latency-ms", "10000000000000000000",
          "--data-dir", str(faultable)], f"at most {MAX_LATENCY_MS} ms"),
        (["--node", "1", "--link", "talker", "--latency-ms", str(MAX_LATENCY_MS),
          "--jitter-ms", "1", "--data-dir", str(faultable)], f"at most {MAX_LATENCY_MS} ms"),
    ]  # fmt: skip
    for args, words in cases:
        code, err = _net(capsys, *args)
        assert code == 2 and words in err and err.count("\n") == 1, (args, err)
    with pytest.raises(SystemExit) as unknown:  # argparse: an unknown link is a bad option
        main(["broker", "net", "--node", "1", "--link", "bogus", "--data-dir", str(faultable)])
    assert unknown.value.code == 2


def test_without_toxiproxy_a_faultable_start_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CODECLOG_TOXIPROXY", str(tmp_path / "absent"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LinkUsageError, match=r"scripts/bootstrap\.sh"):
        find_server()
    code = main(
        ["broker", "start", "--nodes", "3", "--faultable", "--data-dir", str(tmp_path / "c")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Toxiproxy" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("nodes", [[], ["--nodes", "1"]])
def test_faultable_without_a_cluster_is_refused_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    nodes: list[str],
) -> None:
    # a missing java: were the refusal missing, the plain broker it starts fails fast
    monkeypatch.setenv("CODECLOG_JAVA", str(tmp_path / "no-java"))
    data_dir = tmp_path / "b"
    code = main(["broker", "start", "--faultable", *nodes, "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 2 and "--faultable needs a cluster" in err and err.count("\n") == 1, err
    assert not data_dir.exists()  # nothing written, nothing started


def test_the_links_line_of_status() -> None:
    alive = LinksStatus(41, "127.0.0.1:9", ())
    dead = LinksStatus(None, "127.0.0.1:9", ("Toxiproxy is not running (...)",))
    assert format_links_status(alive, stopped=False) == (
        "through Toxiproxy (pid 41, API 127.0.0.1:9), every proxy in place",
        True,
    )
    line, ok = format_links_status(dead, stopped=False)
    assert not ok and line.startswith("UNREACHABLE: Toxiproxy is not running")
    assert format_links_status(dead, stopped=True) == ("stopped (Toxiproxy not running)", True)
    line, ok = format_links_status(alive, stopped=True)
    assert not ok and "still runs though every node is stopped" in line


def test_a_faultable_cluster_is_plaintext_only_and_a_plain_one_stays_plain(
    tmp_path: Path,
) -> None:
    from codeclog.devtools.broker import BrokerSettings

    secured = LocalCluster(tmp_path / "s", 3, BrokerSettings(security="scram"), faultable=True)
    with pytest.raises(LinkUsageError, match="plaintext only"):
        secured.start()
    _write_cluster(tmp_path / "plain", faultable=False)
    with pytest.raises(LinkUsageError, match="not faultable"):
        LocalCluster(tmp_path / "plain", 3, faultable=True).start()


class _SlowFirstAnswers:
    """An HTTP server that sits on each path's first request past the client's timeout and
    answers `[]` (and counts) from then on: Toxiproxy holding a proxy's lock under load."""

    def __init__(self, hold_s: float) -> None:
        import http.server
        import threading

        seen: dict[str, int] = {}
        self.seen = seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                key = f"{self.command} {self.path}"
                seen[key] = seen.get(key, 0) + 1
                if seen[key] == 1:
                    time.sleep(hold_s)
                body = b"[]"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_read_that_times_out_is_tried_again_and_a_change_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from codeclog.devtools import links

    monkeypatch.setattr(links, "API_TIMEOUT_S", 0.3)
    server = _SlowFirstAnswers(hold_s=1.0)
    try:
        toxiproxy = links.Toxiproxy(tmp_path, server.port)
        assert toxiproxy.toxics("p") == []  # the first GET timed out, the second answered
        assert server.seen["GET /proxies/p/toxics"] == 2
        with pytest.raises(LinkError, match="does not answer"):
            toxiproxy.add_toxic("p", {"name": "latency-upstream"})
        assert server.seen["POST /proxies/p/toxics"] == 1  # a change is never sent twice
    finally:
        server.close()
