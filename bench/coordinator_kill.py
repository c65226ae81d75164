"""How often the lag exporter's measurement aborts the process when the group coordinator's
node dies, before and after the fix (issue 43; docs/lag.md, "The exporter's abort").

    python -m bench.coordinator_kill [--cycles N] [--children C] [--timeout-s S]

A local 3-node cluster, a group with committed offsets; C child processes per reader measure the
group's lag (codeclog.lag.measure.LagMeasurer.measure) every 0.5 s while this script kills the
group coordinator's node, waits 8 s, restarts it, waits 8 s, N times:

* before: the group described as `codeclog lag-exporter` did, `describe_consumer_groups` with
  the measurement's timeout as the request's own: librdkafka #4605 aborts the process
  (`rd_kafka_enq_once_del_source_return: Assertion eonce->refcnt > 0`) when that timeout fires
  while the coordinator lookup is in flight;
* after: `LagMeasurer.describe` (the request's own timeout past the broker's, one in flight).

Prints one markdown row per reader: children, killed by SIGABRT, still measuring at the end. A
race: the rate depends on the machine and its load.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from codeclog.devtools.broker import BrokerSettings
from codeclog.devtools.cluster import LocalCluster
from codeclog.devtools.fault_actions import leader_of
from codeclog.devtools.network_faults import group_coordinator_partition

READERS = ("before", "after")
PARTITIONS = 4
CHILD = """
import sys, time
from codeclog.lag.measure import LagMeasurer

bootstrap, group, topic, timeout_s, reader = sys.argv[1:6]
measurer = LagMeasurer({"bootstrap.servers": bootstrap}, timeout_s=float(timeout_s))


def described_as_before(group, topic):
    future = measurer._admin.describe_consumer_groups([group], request_timeout=float(timeout_s))
    try:
        found = future[group].result(timeout=float(timeout_s))
    except Exception:
        return None, None, None
    return str(found.state), len(found.members), set()


if reader == "before":
    measurer.describe = described_as_before
while True:
    try:
        measurer.measure(group, topic, int(time.time() * 1000))
    except Exception as exc:
        print("measurement failed:", type(exc).__name__, flush=True)
    time.sleep(0.5)
"""


def group_with_offsets(bootstrap: str) -> tuple[str, str]:
    """A topic with records and a group that committed offsets on every partition."""
    topic, group = f"kill-{uuid.uuid4().hex[:6]}", f"kill-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(60)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(100):
        producer.produce(topic, b"x", partition=i % PARTITIONS)
    producer.flush(60)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    offsets = [TopicPartition(topic, p, 10) for p in range(PARTITIONS)]
    consumer.commit(offsets=offsets, asynchronous=False)
    consumer.close()
    return topic, group


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=4, help="coordinator kills (default 4)")
    parser.add_argument("--children", type=int, default=2, help="per reader (default 2)")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="the measurement's timeout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = BrokerSettings(heap_max_mb=512, start_timeout_s=240, die_with_parent=True)
        cluster = LocalCluster(Path(tmp) / "cluster", 3, settings)
        cluster.start()
        children: dict[str, list[subprocess.Popen[bytes]]] = {r: [] for r in READERS}
        codes: dict[str, list[int | None]] = {}  # each child's exit code, None: measuring
        try:
            bootstrap = cluster.bootstrap
            topic, group = group_with_offsets(bootstrap)
            for reader in READERS:
                for _ in range(args.children):
                    command = [sys.executable, "-c", CHILD, bootstrap, group, topic]
                    command += [str(args.timeout_s), reader]
                    children[reader].append(
                        subprocess.Popen(
                            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                        )
                    )
            time.sleep(5)
            for cycle in range(args.cycles):
                client = {"bootstrap.servers": bootstrap}
                node = leader_of(client, "__consumer_offsets", group_coordinator_partition(group))
                print(
                    f"cycle {cycle + 1}: SIGKILL node {node} (the group's coordinator)", flush=True
                )
                cluster.kill(node)
                time.sleep(8)
                cluster.restart(node)
                time.sleep(8)
        finally:
            codes = {reader: [c.poll() for c in started] for reader, started in children.items()}
            for started in children.values():
                for child in started:
                    if child.poll() is None:
                        child.kill()
                        child.wait()
            cluster.stop()
    print("\n| reader | children | killed by SIGABRT | still measuring |\n|---|---:|---:|---:|")
    for reader, found in codes.items():
        aborted = sum(code == -signal.SIGABRT for code in found)
        print(f"| {reader} | {len(found)} | {aborted} | {found.count(None)} |")
    print(f"\n{args.cycles} coordinator kills; command: python -m bench.coordinator_kill "
          f"{' '.join(sys.argv[1:])}".rstrip())  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
