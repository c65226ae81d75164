"""A group coordinator that moves or is still loading never kills the lag measurement.

Kafka answers OffsetFetch with NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE while a group's
coordinator moves (a node restart) or has not loaded its __consumer_offsets partition yet (a
fresh cluster: the exporter's first measurement is what creates that topic when no vocoder
ever ran). AdminClient.list_consumer_group_offsets took that answer into a NULL dereference in
librdkafka's main thread (rd_kafka_cgrp_op on an AdminClient, which has no consumer group
handle): SIGSEGV, and faulthandler silent because librdkafka's threads block signals
(docs/lag.md, "The exporter's SIGSEGV"). A real broker gives that answer only in a race, so
librdkafka's own mock cluster gives it here, in a process of its own
(tests/lag/coordinator_probe.py).
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.processes import run_in_tree
from tests.rdkafka_mock import COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds librdkafka in /proc")


@pytest.mark.parametrize(
    "codes",
    [(), (NOT_COORDINATOR,), (COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR)],
    ids=["answered", "not-coordinator", "coordinator-not-available-then-not-coordinator"],
)
def test_measurement_survives_a_coordinator_that_moves(codes: tuple[int, ...]) -> None:
    argv = [sys.executable, "-m", "tests.lag.coordinator_probe", *map(str, codes)]
    result = run_in_tree(argv, timeout_s=60)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-2000:]}"
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    # the committed offset is read once the coordinator answers; partition 1 has none, so its
    # lag counts from the reset position (earliest): every record waits
    assert rows == {"0": [4, 6], "1": [None, 10]}
