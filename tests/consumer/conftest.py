"""Fixtures for the Code2Wav consumer tests: topics per test, publishing, running `vocode`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from codeclog.devtools import stack as devtools_stack
from codeclog.devtools import talker
from codeclog.kafka.topics import ensure_topics
from tests.topics import fresh_topics


class Stack(devtools_stack.Stack):
    """One test's topics on the session broker, and helpers to drive them (codeclog.devtools)."""

    def publish_raw(self, records: list[tuple[bytes | None, bytes]]) -> None:
        producer = Producer(
            {**self.client, "enable.idempotence": True, "partitioner": "murmur2_random"}
        )
        for key, value in records:
            producer.produce(self.topics.chunks, key=key, value=value)
        assert producer.flush(30) == 0


def LiveTalker(
    stack: Stack, sessions: int, seconds: float, seed: int, **options: Any
) -> talker.LiveTalker:
    """The tests' shorthand: a started realtime talker on `stack`'s chunk topic, with
    Stack.live_talker's options (producer_id, close_s, PublisherConfig fields)."""
    return stack.live_talker(talker.Speech(sessions, seconds, seed), **options)


@pytest.fixture
def stack(
    kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path
) -> Iterator[Stack]:
    topics = fresh_topics(unique_name)
    ensure_topics({"bootstrap.servers": kafka_bootstrap}, topics)
    result = Stack(
        kafka_bootstrap, topics, topics_file(topics, tmp_path), unique_name("group"), tmp_path
    )
    yield result
    result.kill_processes()


topics_file = devtools_stack.write_topics_file  # `topics` as the file --topics-config reads


@pytest.fixture(scope="session")
def tiny_engine() -> Any:
    pytest.importorskip("torch")
    from codeclog.vocoder.engine import Code2WavEngine

    return Code2WavEngine.from_spec("tiny")
