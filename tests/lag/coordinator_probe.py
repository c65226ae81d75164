"""One lag measurement while the group coordinator answers OffsetFetch with the given errors
(NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE: a coordinator moving or still loading), on
librdkafka's mock cluster; prints the committed offsets and lags as one JSON line.

Run in a process of its own by tests/lag/test_lag_coordinator.py, because what it guards
against killed the process: AdminClient.list_consumer_group_offsets took such an answer into a
SIGSEGV inside librdkafka (docs/lag.md, "The exporter's SIGSEGV").

    python -m tests.lag.coordinator_probe 16 15
"""

from __future__ import annotations

import json
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from codeclog.lag.measure import LagMeasurer
from tests.rdkafka_mock import API_OFFSET_FETCH, MockCluster

GROUP = "codeclog-vocoder"
TOPIC = "codec.chunks"
RECORDS = 10
COMMITTED = 4  # on partition 0; partition 1 has no committed offset


def prepare(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in (0, 1):
        for _ in range(RECORDS):
            producer.produce(TOPIC, b"not a chunk", partition=partition)
    if producer.flush(10) != 0:
        raise RuntimeError("the mock cluster did not take the records")
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP})
    committer.commit(offsets=[TopicPartition(TOPIC, 0, COMMITTED)], asynchronous=False)
    committer.close()


def main(codes: list[int]) -> int:
    cluster = MockCluster()
    cluster.create_topic(TOPIC, 2)
    prepare(cluster.bootstrap)
    cluster.push_request_errors(API_OFFSET_FETCH, *codes)
    measurer = LagMeasurer(
        {"bootstrap.servers": cluster.bootstrap}, timeout_s=10.0, read_timeout_s=1.0
    )
    measured = measurer.measure(GROUP, TOPIC, int(time.time() * 1000))
    measurer.close()
    rows = {p.partition: [p.committed_offset, p.lag] for p in measured.partitions}
    print(json.dumps(rows, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main([int(code) for code in sys.argv[1:]]))
