"""The fault matrix (issue 19): a realtime talker and two `codeclog vocode` members on a local
3-node cluster (RF 3, min ISR 2), one fault per run, injected at a seeded random moment.
codeclog.devtools.faults runs one fault (fault_actions: the faults, `--faults`, default all) and
states the checks after each run and what is measured; this script starts the cluster, runs
the faults and prints the table.

    python -m bench.faults --seed 7                      # the full matrix (about 15-20 min)
    python -m bench.faults --faults leader pause --seed 3
    python -m bench.faults --latency                     # + Kafka path, 3 nodes vs 1 node

It ends with the README "Fault matrix" table; `--json FILE` writes every figure.
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
from codeclog.devtools import fault_actions, faults
from codeclog.devtools.broker import BrokerSettings, LocalBroker
from codeclog.devtools.cluster import LocalCluster
from codeclog.devtools.fault_actions import FAULTS
from codeclog.devtools.faults import FaultRow, fault_table, run_fault


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


def start_cluster(data_dir: Path) -> LocalCluster:
    settings = BrokerSettings(
        heap_min_mb=128,
        heap_max_mb=512,
        start_timeout_s=180,
        die_with_parent=True,
        extra_jvm_args=("-XX:TieredStopAtLevel=1",),
    )
    cluster = LocalCluster(data_dir, 3, settings)
    cluster.start()
    return cluster


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        epilog=f"{fault_actions.__doc__}\n{faults.__doc__}",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    parser.add_argument("--seed", type=int, default=7, help="the moments of injection")
    parser.add_argument("--latency", action="store_true", help="also 3 nodes vs 1, instant engine")
    parser.add_argument("--streams", type=int, default=50, help="streams of the latency rows")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of a latency row")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--keep", type=Path, help="keep cluster data and member logs here")
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
        cluster = start_cluster(workdir / "cluster")
        rows: list[FaultRow] = []
        latency = ""
        try:
            for fault in args.faults:
                row = run_fault(cluster, fault, rng, engine, workdir, args.seed)
                rows.append(row)
                print(json.dumps(dataclasses.asdict(row)), flush=True)
            if args.latency:
                latency = latency_rows(cluster.bootstrap, workdir, args.streams, args.seconds)
        finally:
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
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
