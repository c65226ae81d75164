"""The librdkafka behaviour behind the post-failover stall (issue 19), on the real broker.

A partition that is paused, revoked, and assigned back to the same member stays paused: it
delivers nothing, with no error, until the member resumes it. The service paused its whole
assignment while a step decoded and, at the end of the step, resumed only what it still owned,
so a partition lost mid-decode (session expired during a leader failover) and given back later
stayed paused for good. `VocoderService._resume_paused` resumes it when it is back
(test_service_pause.py pins that call pattern).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _drain(consumer: Consumer, seconds: float) -> dict[int, int]:
    got: dict[int, int] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        message = consumer.poll(0.1)
        if message is not None and message.error() is None:
            got[message.partition() or 0] = got.get(message.partition() or 0, 0) + 1
    return got


def _until(condition: Callable[[], bool], consumers: list[Consumer], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within 60 s"
        for consumer in consumers:
            _drain(consumer, 0.2)


def test_a_paused_partition_revoked_and_given_back_stays_paused(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    topic, group = unique_name("paused"), unique_name("paused-group")
    client = {"bootstrap.servers": kafka_bootstrap}
    admin = AdminClient(client)  # held: a collected client fails its futures (_DESTROY)
    for future in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        future.result(30)
    producer = Producer(client)

    def produce() -> None:
        for _ in range(5):
            for partition in (0, 1):
                producer.produce(topic, b"x", partition=partition)
        assert producer.flush(30) == 0

    config: dict[str, Any] = {
        **client,
        "group.id": group,
        "partition.assignment.strategy": "cooperative-sticky",
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "log_level": 2,
    }
    first, second = Consumer(config), Consumer(config)
    try:
        first.subscribe([topic])
        produce()
        _until(lambda: len(first.assignment()) == 2, [first], "the first member's assignment")
        _drain(first, 3)
        first.pause(first.assignment())  # as the service during a decode
        second.subscribe([topic])
        _until(lambda: len(first.assignment()) == 1, [first, second], "a partition moving")
        (moved,) = {0, 1} - {tp.partition for tp in first.assignment()}
        first.resume(first.assignment())  # the end of the step: what is still ours
        second.close()
        _until(lambda: len(first.assignment()) == 2, [first], "the partition coming back")
        produce()
        got = _drain(first, 8)
        assert got.get(1 - moved) == 5
        assert moved not in got  # given back, still paused: nothing, and no error
        first.resume([tp for tp in first.assignment() if tp.partition == moved])
        _until(lambda: moved in _drain(first, 1), [first], "records after resuming it")
    finally:
        first.close()
