"""The fault matrix (issues 19 and 31): a realtime talker and two `codeclog vocode` members on a
local faultable 3-node cluster (RF 3, min ISR 2; every link through Toxiproxy), one fault per
run, injected at a seeded random moment: the process faults (fault_actions) and the network
faults (network_faults). codeclog.devtools.faults runs one fault and states the checks after
each run (verify, the audit, the independent history checker) and what is measured; this script
starts the cluster, runs the faults and prints the table.

    python -m bench.faults --seed 7                      # every fault (about 40 min)
    python -m bench.faults --faults network --seed 3     # the network faults only
    python -m bench.faults --faults leader delayed-write --keep /tmp/fm  # cluster left running
    python -m bench.faults --latency                     # + Kafka path, 3 nodes vs 1 node

`--json FILE` writes, per fault: lost, duplicated, anomalies (by kind), gap_s, recovery_s,
result (and every figure under "details"). `--keep DIR` runs the cluster in DIR and leaves it
running after the last fault, its addresses in DIR/bootstrap (and bootstrap-member,
bootstrap-talker): `codeclog broker stop --data-dir DIR` ends it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_consumer import InstantEngine, kafka_path
from codeclog.devtools import fault_actions, faults, network_faults
from codeclog.devtools.broker import BrokerSettings, LocalBroker
from codeclog.devtools.cluster import LocalCluster
from codeclog.devtools.fault_actions import FAULTS
from codeclog.devtools.faults import FaultRow, fault_table, run_fault
from codeclog.devtools.links import LinkUsageError
from codeclog.devtools.network_faults import NETWORK_FAULTS


def latency_rows(cluster_bootstrap: str, workdir: Path, streams: int, seconds: float) -> str:
    """The Kafka path (bench_consumer's instant engine) on the 3-node cluster and on one broker,
    in the same run."""
    single = LocalBroker(
        workdir / "single",
        BrokerSettings(heap_max_mb=512, start_timeout_s=180, die_with_parent=True),
    )
    bootstrap = single.start().bootstrap
    lines = [
        "| cluster | acks | streams | e2e p50 / p99 ms | added by Kafka p50 / p99 ms "
        "| of which step minus decode p50 / p99 ms |",
        "|---|---|---:|---:|---:|---:|",
    ]
    try:
        engine = InstantEngine()
        for name, where in (
            ("1 node (RF 1)", bootstrap),
            ("3 nodes (RF 3, min ISR 2)", cluster_bootstrap),
        ):
            kafka_path(where, engine, 10, 6.0)  # warm the coordinators and the JIT
            r = kafka_path(where, engine, streams, seconds)
            lines.append(
                f"| {name} | all | {streams} | {r['e2e_p50_ms']:.0f} / {r['e2e_p99_ms']:.0f} "
                f"| {r['added_p50_ms']:.0f} / {r['added_p99_ms']:.0f} "
                f"| {r['txn_p50_ms']:.0f} / {r['txn_p99_ms']:.0f} |"
            )
    finally:
        single.stop()
    return "\n".join(lines)


def start_cluster(data_dir: Path, keep: bool = False) -> LocalCluster:
    """A faultable 3-node cluster; with `keep` it outlives this process."""
    settings = BrokerSettings(
        heap_min_mb=128,
        heap_max_mb=512,
        start_timeout_s=180,
        die_with_parent=not keep,
        extra_jvm_args=("-XX:TieredStopAtLevel=1",),
    )
    cluster = LocalCluster(data_dir, 3, settings, faultable=True)
    cluster.start()
    return cluster


def chosen_faults(names: list[str]) -> list[str]:
    """Fault names, with the groups `process`, `network` and `all` spelled out."""
    groups = {"process": FAULTS, "network": NETWORK_FAULTS, "all": FAULTS + NETWORK_FAULTS}
    return list(dict.fromkeys(f for name in names for f in groups.get(name, (name,))))


def keep_running(cluster: LocalCluster, folder: Path) -> None:
    """Leave the cluster running; its addresses in FOLDER/bootstrap (and -member, -talker)."""
    layout = cluster.layout()
    (folder / "bootstrap").write_text(layout.bootstrap + "\n")
    for link in ("member", "talker"):
        (folder / f"bootstrap-{link}").write_text(layout.link_bootstrap(link) + "\n")
    print(
        f"the cluster keeps running in {folder} ({layout.bootstrap}); "
        f"`codeclog broker stop --data-dir {folder}` ends it",
        file=sys.stderr,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        epilog=f"{fault_actions.__doc__}\n{network_faults.__doc__}\n{faults.__doc__}",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument(
        "--faults",
        nargs="+",
        choices=(*FAULTS, *NETWORK_FAULTS, "process", "network", "all"),
        default=["all"],
        help="faults, or the groups process, network, all (default)",
    )
    parser.add_argument("--seed", type=int, default=7, help="the moments of injection")
    parser.add_argument("--latency", action="store_true", help="also 3 nodes vs 1, instant engine")
    parser.add_argument("--streams", type=int, default=50, help="streams of the latency rows")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of a latency row")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument(
        "--keep",
        type=Path,
        help="run the cluster in this folder (with the members' logs) and leave it running",
    )
    args = parser.parse_args()

    from codeclog.vocoder.engine import Code2WavEngine

    # librdkafka's lines about the brokers this script takes down are expected: not on stderr
    kafka_log = logging.getLogger("codeclog.kafka")
    kafka_log.addHandler(logging.NullHandler())
    kafka_log.propagate = False
    engine = Code2WavEngine.from_spec("tiny")
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)
        started = time.monotonic()
        try:
            cluster = start_cluster(workdir if args.keep else workdir / "cluster", bool(args.keep))
        except LinkUsageError as exc:  # no Toxiproxy: one line
            print(f"bench.faults: {exc}", file=sys.stderr)
            return 2
        rows: list[FaultRow] = []
        latency = ""
        try:
            for fault in chosen_faults(args.faults):
                row = run_fault(cluster, fault, rng, engine, workdir, args.seed)
                rows.append(row)
                print(json.dumps(row.summary()), flush=True)
            if args.latency:
                latency = latency_rows(cluster.bootstrap, workdir, args.streams, args.seconds)
        finally:
            if args.keep:
                keep_running(cluster, workdir)
            else:
                cluster.stop()
        took = time.monotonic() - started
    print()
    print(fault_table(rows))
    if latency:
        print()
        print(latency)
    load = os.getloadavg()[0]
    print(
        f"\n{len(rows)} faults in {took / 60:.1f} min, load average {load:.1f} "
        f"on {os.cpu_count()} cores"
    )
    print(f"command: python -m bench.faults {' '.join(sys.argv[1:])}".rstrip())
    if args.json:
        summaries = [r.summary() | {"details": dataclasses.asdict(r)} for r in rows]
        args.json.write_text(json.dumps(summaries, indent=1, default=str))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
