"""`codeclog broker start|stop|status|fetch|kill|pause|resume|restart|net`: the local Kafka broker,
or a local cluster of N nodes (`start --nodes 3`) whose links can fail when started `--faultable`
(`net`). The tables `status` and `net` print are in codeclog.cli.broker_tables."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from codeclog.cli.broker_tables import (
    format_cluster_status,
    format_links,
    format_links_status,
    format_status,
)
from codeclog.cli.parsing import add_flag
from codeclog.devtools.broker import (
    BROKER_START_TIMEOUT_S,
    BrokerSettings,
    BrokerStatusKind,
    LocalBroker,
)
from codeclog.devtools.broker_errors import ClusterError
from codeclog.devtools.cluster import (
    CLUSTER_START_TIMEOUT_S,
    NODE_HEAP_MAX_MB,
    NODE_HEAP_MIN_MB,
    NODE_RSS_NOTE,
    LocalCluster,
    NodeStatusKind,
)
from codeclog.devtools.jars import ENV_KAFKA_LIBS, KAFKA_VERSION, JarFetcher
from codeclog.devtools.links import (
    DOWN,
    HEAL,
    LINKS,
    MAX_LATENCY_MS,
    RESET,
    Fault,
    LinkUsageError,
    latency,
)
from codeclog.devtools.security import SECURITY_CHOICES, SUPER_USER
from codeclog.errors import (
    EXIT_BROKER_STOPPED,
    EXIT_FAILURE,
    CodeclogError,
    ConfigError,
    UsageError,
    exit_code,
)
from codeclog.paths import ENV_DATA_DIR, default_data_dir

DESCRIPTION = f"""\
Run a real single-node Apache Kafka {KAFKA_VERSION} broker (KRaft, broker and controller in one
JVM) on 127.0.0.1, from Maven Central jars: no Docker, no tarball. Needs Java 17+, and Maven
once to fetch the jars (about 45 MB, cached).

Each data dir holds one broker: its config, its Kafka data, broker.log and broker.json (pid,
ports, bootstrap). Several brokers with different data dirs can run at once. Other codeclog
commands find the broker of --data-dir (or ${ENV_DATA_DIR}) by themselves.

`start --nodes 3` runs a local cluster instead: three KRaft nodes (broker and controller each,
a controller quorum of three) in node-1/, node-2/, node-3/ under --data-dir, with replication
factor 3 and min.insync.replicas 2 for the internal and default topics, unclean leader election
off. Memory: each node's JVM heap is {NODE_HEAP_MIN_MB}..{NODE_HEAP_MAX_MB} MiB ({NODE_RSS_NOTE}),
so three nodes fit a 2-core, 24 GB machine; a single broker's heap is 256..1024 MiB.
stop and status act on the whole cluster; kill, pause, resume and restart take --node N
(SIGKILL, SIGSTOP, SIGCONT of that node's JVM; restart = stop if running, then start).

`start --nodes 3 --faultable` puts every node's traffic behind Toxiproxy, one proxy per link:
clients (consumers, readers, admin), member (one member to fault alone: its own bootstrap),
talker (the chunk producer: its own bootstrap) and peers (replication and the controller
quorum); start prints the clients, member and talker bootstraps, one per line. `net --node N
--link L` then slows, cuts or resets that link (or heals it), so an operator can rehearse a
network failure of their own pipeline; `net` alone prints what each link does now. Toxiproxy is
built by scripts/bootstrap.sh (Go's `go install`, cached).
"""

EPILOG = f"""\
examples:
  codeclog broker start                      # prints the bootstrap address, e.g. 127.0.0.1:40123
  export CODECLOG_BOOTSTRAP=$(codeclog broker start)
  codeclog broker status                     # running/stopped, pid, bootstrap, data dir, log
  codeclog broker stop                       # SIGTERM, SIGKILL after 30 s; the data is kept
  codeclog broker start --data-dir /tmp/kb2  # a second, independent broker
  codeclog broker start --nodes 3 --data-dir /tmp/c3   # a 3-node cluster; prints 3 addresses
  codeclog broker kill --node 2 --data-dir /tmp/c3     # SIGKILL node 2 (a fault drill)
  codeclog broker restart --node 2 --data-dir /tmp/c3  # back, same ports and data
  codeclog broker pause --node 1 --data-dir /tmp/c3    # SIGSTOP; `resume --node 1` to SIGCONT
  codeclog broker start --nodes 3 --faultable --data-dir /tmp/f3  # links through Toxiproxy
  codeclog broker net --node 2 --link clients --latency-ms 800 --jitter-ms 200 --data-dir /tmp/f3
  codeclog broker net --node 1 --link peers --down --data-dir /tmp/f3  # node 1 cut from peers
  codeclog broker net --node 1 --link peers --heal --data-dir /tmp/f3
  codeclog broker net --data-dir /tmp/f3               # what every link does now

environment:
  {ENV_DATA_DIR}    default data dir (else {default_data_dir()})
  {ENV_KAFKA_LIBS}  jar cache dir (else under the user cache dir)
  CODECLOG_JAVA / JAVA_HOME   which java to run (else `java` on PATH)

status exit codes: 0 running, 3 stopped, 1 crashed (its state file names a dead pid).
For a cluster: 0 every node running, 3 every node stopped, 1 otherwise (a node crashed,
was killed, is paused or stopped). A faultable cluster's status also checks Toxiproxy and its
proxies (`links:`): running nodes behind a dead Toxiproxy or a missing proxy are unreachable,
exit 1, as is a Toxiproxy left running with every node stopped.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "broker",
        help="start, stop or inspect the local Kafka broker",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="broker_action", metavar="ACTION", required=True)
    for name, summary, func in _ACTIONS:
        action = actions.add_parser(name, help=summary, description=summary)
        if name != "fetch":
            _add_data_dir(action)
        if name == "start":
            _add_start_options(action)
        if name in _NODE_ACTIONS:
            action.add_argument(
                "--node", type=int, required=True, metavar="N", help="the node id (1..nodes)"
            )
        if name == "net":
            _add_net_options(action)
        action.set_defaults(func=_guarded(func))


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"the broker's data dir (default: ${ENV_DATA_DIR}, else {default_data_dir()})",
    )


def _add_start_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="start a local cluster of N nodes (2..9; 3 is the tested shape) instead of one "
        "broker (default: one broker, or the cluster the data dir already holds); each node "
        f"takes a {NODE_HEAP_MIN_MB}..{NODE_HEAP_MAX_MB} MiB heap ({NODE_RSS_NOTE})",
    )
    parser.add_argument(
        "--heap-max-mb",
        type=int,
        default=None,
        help=f"JVM max heap in MiB (default 1024 for one broker, {NODE_HEAP_MAX_MB} per node "
        "of a cluster)",
    )
    parser.add_argument(
        "--security",
        choices=SECURITY_CHOICES,
        default=None,
        help="scram: SASL_SSL with SCRAM-SHA-512 only (a local CA and broker certificate, the "
        "StandardAuthorizer denying what no ACL allows, the super user admin and the users "
        "talker, vocoder, monitor, replay; one --kafka-config file per user under "
        "<data-dir>/security/); none: PLAINTEXT (default: what the data dir holds, none for a "
        "new one). Chosen at the first start, for one broker or a whole --nodes cluster (one CA, "
        "one broker key and one set of users for every node; role files name every node)",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help=f"give up if the broker (every node of a cluster) is not serving requests after "
        f"this long, and stop what this start began (default {BROKER_START_TIMEOUT_S:.0f}; "
        f"{CLUSTER_START_TIMEOUT_S:.0f} for a cluster, whose JVMs share the cores)",
    )
    add_flag(
        parser,
        "--faultable",
        help="with --nodes N (2..9): every node's links (clients, member, talker, peers) run "
        "through Toxiproxy, so `broker net` can slow, cut or reset them; plaintext only; chosen "
        "at the first start (a single broker has no links to fault: refused)",
    )


def _add_net_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", type=int, metavar="N", help="the node id (1..nodes)")
    parser.add_argument(
        "--link",
        choices=LINKS,
        help="clients (consumers, readers, admin to the node), member (one consumer member "
        "given this link's bootstrap, to fault it alone), talker (the chunk producer to the "
        "node) or peers (the other nodes to it: replication and the controller quorum)",
    )
    fault = parser.add_mutually_exclusive_group()
    fault.add_argument(
        "--latency-ms",
        type=int,
        metavar="MS",
        help=f"hold every byte MS ms, both directions (MS plus J at most {MAX_LATENCY_MS}: "
        "Toxiproxy counts a delay in 64-bit nanoseconds)",
    )
    add_flag(fault, "--down", help="a black hole: connections stay open, nothing passes")
    add_flag(fault, "--reset", help="reset every connection a few ms after it opens")
    add_flag(fault, "--heal", help="the link back to normal")
    parser.add_argument(
        "--jitter-ms", type=int, default=0, metavar="J", help="with --latency-ms: +- J ms"
    )


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Errors a user can cause become one sentence on stderr: exit 2 for a usage or
    configuration error, else 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except (CodeclogError, ConfigError) as exc:
            print(f"codeclog broker {args.broker_action}: {exc}", file=sys.stderr)
            return exit_code(exc)

    return run


def _progress(message: str) -> None:
    print(f"codeclog: {message}", file=sys.stderr, flush=True)


def _data_dir(args: argparse.Namespace) -> Path:
    return Path(args.data_dir or default_data_dir())


def _timeout_s(args: argparse.Namespace, default: float) -> float:
    """--timeout-s as the user gave it (start only), else `default`."""
    given: float | None = getattr(args, "timeout_s", None)
    return default if given is None else given


def _broker(args: argparse.Namespace) -> LocalBroker:
    heap_max_mb = getattr(args, "heap_max_mb", None) or 1024
    settings = BrokerSettings(
        heap_min_mb=min(256, heap_max_mb),
        heap_max_mb=heap_max_mb,
        start_timeout_s=_timeout_s(args, BROKER_START_TIMEOUT_S),
        security=getattr(args, "security", None),
    )
    return LocalBroker(_data_dir(args), settings)


def _cluster(args: argparse.Namespace) -> LocalCluster:
    heap_max_mb = getattr(args, "heap_max_mb", None) or NODE_HEAP_MAX_MB
    settings = BrokerSettings(
        heap_min_mb=min(NODE_HEAP_MIN_MB, heap_max_mb),
        heap_max_mb=heap_max_mb,
        start_timeout_s=_timeout_s(args, CLUSTER_START_TIMEOUT_S),
        security=getattr(args, "security", None),
    )
    faultable = bool(getattr(args, "faultable", False))
    return LocalCluster(
        _data_dir(args), getattr(args, "nodes", None), settings, faultable=faultable
    )


def _is_cluster(args: argparse.Namespace) -> bool:
    nodes = getattr(args, "nodes", None)
    return (nodes is not None and nodes != 1) or LocalCluster.holds_cluster(_data_dir(args))


def _start(args: argparse.Namespace) -> int:
    started = time.monotonic()
    if args.faultable and not _is_cluster(args):
        raise LinkUsageError(
            "--faultable needs a cluster: a single broker has no links to fault; add --nodes 3 "
            "(2..9)"
        )
    if _is_cluster(args):
        cluster = _cluster(args)
        layout = cluster.start(_progress)
        _progress(
            f"{layout.nodes}-node cluster ready in {time.monotonic() - started:.1f} s; logs: "
            f"{_data_dir(args)}/node-N/broker.log"
        )
        _print_role_configs({user: str(path) for user, path in cluster.role_configs().items()})
        print(layout.bootstrap)
        if layout.faultable:
            _progress("faultable: then the member link's bootstrap and the talker's")
            print(layout.link_bootstrap("member"))
            print(layout.link_bootstrap("talker"))
        return 0
    state = _broker(args).start(_progress)
    _progress(f"broker ready in {time.monotonic() - started:.1f} s; log: {state.log_path}")
    _print_role_configs(state.role_configs or {})
    print(state.bootstrap)
    return 0


def _print_role_configs(role_configs: dict[str, str]) -> None:
    if not role_configs:
        return
    _progress("SASL_SSL + SCRAM-SHA-512; pass one of these as --kafka-config:")
    for user, path in role_configs.items():
        _progress(f"  {user:<8} {path}")
    _progress(
        "then grant the roles: codeclog topics create --acls --kafka-config "
        f"{role_configs[SUPER_USER]}"
    )


def _stop(args: argparse.Namespace) -> int:
    if LocalCluster.holds_cluster(_data_dir(args)):
        results = _cluster(args).stop(_progress)
        stopped = [n for n, r in results.items() if r.was_running]
        forced = [n for n, r in results.items() if r.forced]
        if not stopped:
            _progress("no node of the cluster was running")
        else:
            elapsed = max(r.elapsed_s for r in results.values())
            _progress(f"nodes {', '.join(map(str, stopped))} stopped in {elapsed:.1f} s")
        if forced:
            _progress(f"nodes {', '.join(map(str, forced))} ignored SIGTERM and were killed")
        return 0
    result = _broker(args).stop(_progress)
    if not result.was_running:
        _progress("no broker was running for that data dir")
    elif result.forced:
        _progress(f"the broker ignored SIGTERM; killed it after {result.elapsed_s:.1f} s")
    else:
        _progress(f"broker stopped in {result.elapsed_s:.1f} s; its data is kept")
    return 0


def _status(args: argparse.Namespace) -> int:
    if LocalCluster.holds_cluster(_data_dir(args)):
        cluster = _cluster(args)
        statuses = cluster.status()
        layout = cluster.layout()
        links = cluster.links_status()
        print(
            format_cluster_status(statuses, layout.cluster_id, layout.bootstrap, cluster.data_dir)
        )
        kinds = {s.kind for s in statuses}
        links_ok = True
        if links is not None:
            line, links_ok = format_links_status(links, kinds == {NodeStatusKind.STOPPED})
            print(f"{'links:':<12}{line}")
        if kinds == {NodeStatusKind.RUNNING} and links_ok:
            return 0
        if kinds == {NodeStatusKind.STOPPED} and links_ok:
            return EXIT_BROKER_STOPPED
        return EXIT_FAILURE
    status = _broker(args).status()
    print(format_status(status))
    codes = {BrokerStatusKind.RUNNING: 0, BrokerStatusKind.STOPPED: 3, BrokerStatusKind.CRASHED: 1}
    return codes[status.kind]


class NoClusterError(ClusterError, UsageError):
    """A node action (kill, pause, ...) on a data dir without a local cluster: a usage error
    (exit 2), as `net` says for the same mistake."""


def _node_action(args: argparse.Namespace) -> int:
    action = args.broker_action
    if not LocalCluster.holds_cluster(_data_dir(args)):
        raise NoClusterError(
            f"{_data_dir(args)} holds no local cluster (`codeclog broker start --nodes 3`); "
            f"`{action} --node` acts on one node of a cluster"
        )
    cluster = _cluster(args)
    if action == "restart":
        started = time.monotonic()
        state = cluster.restart(args.node, _progress)
        _progress(f"node {args.node} ready in {time.monotonic() - started:.1f} s")
        print(state.bootstrap)
        return 0
    getattr(cluster, action)(args.node, _progress)
    return 0


def _net(args: argparse.Namespace) -> int:
    if not LocalCluster.holds_cluster(_data_dir(args)):
        raise LinkUsageError(
            f"{_data_dir(args)} holds no local cluster: `net` acts on the links of a cluster "
            "started with `codeclog broker start --nodes 3 --faultable`"
        )
    cluster = _cluster(args)
    fault = _net_fault(args)
    if fault is None:
        print(format_links(cluster.link_faults()))
        return 0
    if args.node is None or args.link is None:
        raise LinkUsageError("a fault names its --node and its --link")
    cluster.net(args.node, args.link, fault, _progress)
    return 0


def _net_fault(args: argparse.Namespace) -> Fault | None:
    """The fault the options ask for; None: only show the links."""
    if args.latency_ms is not None:
        fault = latency(args.latency_ms, args.jitter_ms)
        fault.check()  # before anything is asked of Toxiproxy
        return fault
    if args.jitter_ms:
        raise LinkUsageError("--jitter-ms goes with --latency-ms")
    chosen = {"down": DOWN, "reset": RESET, "heal": HEAL}
    return next((fault for flag, fault in chosen.items() if getattr(args, flag)), None)


def _fetch(_args: argparse.Namespace) -> int:
    print(JarFetcher().ensure(_progress))
    return 0


_ACTIONS: tuple[tuple[str, str, Callable[[argparse.Namespace], int]], ...] = (
    ("start", "start the broker (fetch jars, format the dir first if needed)", _start),
    ("stop", "stop the broker: SIGTERM, then SIGKILL after 30 s; data is kept", _stop),
    ("status", "print running/stopped, pid, bootstrap, data dir and log path", _status),
    ("fetch", "fetch (or verify) the broker's jars and print their dir", _fetch),
    ("kill", "SIGKILL one node's JVM of a local cluster (a fault drill)", _node_action),
    ("pause", "SIGSTOP one node's JVM of a local cluster (it answers nothing)", _node_action),
    ("resume", "SIGCONT a paused node of a local cluster", _node_action),
    ("restart", "stop one node of a local cluster if it runs, then start it again", _node_action),
    ("net", "slow, cut, reset or heal one link of a faultable cluster's node", _net),
)
_NODE_ACTIONS = ("kill", "pause", "resume", "restart")
