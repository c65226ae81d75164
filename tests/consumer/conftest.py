"""Fixtures for the Code2Wav consumer tests: topics per test, publishing, running `vocode`."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from codeclog.topics import ensure_topics
from codeclog.topics_config import TopicsConfig

ROOT = Path(__file__).resolve().parents[2]


class LiveTalker:
    """A realtime talker in a background thread (streams stay open for `seconds`): one
    ChunkPublisher through the whole run, closed with `close_s` to deliver what it holds."""

    def __init__(self, stack: Stack, sessions: int, seconds: float, seed: int, **options: Any):
        self.failed: int | None = None  # the publisher's failed deliveries, once it closed
        self._args = (stack, sessions, seconds, seed)
        self._producer_id = options.pop("producer_id", "live-talker")
        self._close_s = options.pop("close_s", 60.0)
        self._config = options  # more PublisherConfig fields (delivery_timeout_ms, ...)
        self._thread = threading.Thread(target=self._talk, daemon=True)
        self._thread.start()

    def _talk(self) -> None:
        from codeclog.producers.publisher import ChunkPublisher, PublisherConfig
        from codeclog.producers.synthetic import SyntheticConfig, merged, play, scripts
        from codeclog.producers.talker import Talker, wall_clock_ms

        stack, sessions, seconds, seed = self._args
        config = PublisherConfig(
            topic=stack.topics.chunks, producer_id=self._producer_id, **self._config
        )
        publisher = ChunkPublisher(stack.client, config)
        talker = Talker(publisher, producer_id=self._producer_id, native_duplex=True)
        play(
            merged(scripts(SyntheticConfig(sessions=sessions, seconds=seconds, seed=seed))),
            talker.apply,
            total_s=seconds,
            realtime=True,
            clock=time.monotonic,
            sleep=time.sleep,
            now_ms=wall_clock_ms,
        )
        publisher.close(self._close_s)
        self.failed = publisher.stats.failed

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def delivered_everything(self) -> bool:
        return not self.is_alive() and self.failed == 0


@dataclasses.dataclass
class Stack:
    """One test's topics on the session broker, and helpers to drive them."""

    bootstrap: str
    topics: TopicsConfig
    topics_file: Path
    group: str
    tmp: Path
    processes: list[subprocess.Popen[bytes]] = dataclasses.field(default_factory=list)
    log_of: dict[int, Path] = dataclasses.field(default_factory=dict)

    @property
    def client(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    def publish_sessions(self, sessions: int, seconds: float, seed: int) -> int:
        """Synthetic duplex sessions, published as fast as possible; returns records sent."""
        from codeclog.producers.publisher import ChunkPublisher, PublisherConfig
        from codeclog.producers.synthetic import SyntheticConfig, merged, play, scripts
        from codeclog.producers.talker import Talker, wall_clock_ms

        config = SyntheticConfig(sessions=sessions, seconds=seconds, seed=seed)
        publisher = ChunkPublisher(
            self.client, PublisherConfig(topic=self.topics.chunks, producer_id="test-talker")
        )
        talker = Talker(publisher, producer_id="test-talker", native_duplex=True)
        result = play(
            merged(scripts(config)),
            talker.apply,
            total_s=seconds,
            realtime=False,
            clock=time.monotonic,
            sleep=time.sleep,
            now_ms=wall_clock_ms,
        )
        report = publisher.close(30)
        assert report.undelivered == 0 and publisher.stats.failed == 0
        return result.records

    def publish_raw(self, records: list[tuple[bytes | None, bytes]]) -> None:
        producer = Producer(
            {**self.client, "enable.idempotence": True, "partitioner": "murmur2_random"}
        )
        for key, value in records:
            producer.produce(self.topics.chunks, key=key, value=value)
        assert producer.flush(30) == 0

    def committed_everything(self) -> bool:
        """The group's committed offsets are at the end of every chunk partition."""
        consumer = Consumer(
            {**self.client, "group.id": self.group, "isolation.level": "read_committed"}
        )
        try:
            parts = [TopicPartition(self.topics.chunks, p) for p in range(self.topics.partitions)]
            for tp in consumer.committed(parts, timeout=30):
                _, high = consumer.get_watermark_offsets(tp, timeout=30)
                if high > 0 and tp.offset < high - 1:  # the end may be one commit marker further
                    return False
            return True
        finally:
            consumer.close()

    def stop_once_committed(self, process: subprocess.Popen[bytes], timeout_s: float) -> int:
        """SIGTERM a member once its group committed everything (rather than wait out its idle
        exit); its exit code. One that exits first (or never gets there) is waited for."""
        deadline = time.monotonic() + timeout_s
        while process.poll() is None and time.monotonic() < deadline:
            if self.committed_everything():
                process.send_signal(signal.SIGTERM)
                break
            time.sleep(1.0)
        return process.wait(timeout_s)

    def vocode(self, instance: str, *extra: str, idle_s: float = 4.0) -> subprocess.Popen[bytes]:
        """Start `codeclog vocode` as its own process (it can be SIGKILLed)."""
        log = (self.tmp / f"vocode-{instance}-{len(self.processes)}.log").open("wb")
        command = [
            sys.executable,
            "-m",
            "codeclog.cli",
            "vocode",
            "--bootstrap",
            self.bootstrap,
            "--topics-config",
            str(self.topics_file),
            "--group",
            self.group,
            "--instance-id",
            instance,
            "--exit-when-idle",
            str(idle_s),
            *extra,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.processes.append(process)
        self.log_of[process.pid] = Path(log.name)
        return process

    def wait_for_log(self, process: subprocess.Popen[bytes], text: str, timeout_s: float) -> None:
        """Wait until the process logged `text` (e.g. its partitions were assigned)."""
        path = self.log_of[process.pid]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in path.read_text(errors="replace"):
                return
            assert process.poll() is None, self.logs()
            time.sleep(0.2)
        raise AssertionError(f"no {text!r} in {path} after {timeout_s} s:\n{self.logs()}")

    def kill_processes(self) -> None:
        """SIGKILL every process this stack started that still runs (test teardown)."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-3000:] for p in sorted(self.tmp.glob("*.log"))
        )


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


def fresh_topics(unique_name: Callable[[str], str], partitions: int = 4) -> TopicsConfig:
    """One test's own topic names (4 partitions unless told)."""
    names = {kind: unique_name(kind) for kind in ("chunks", "audio", "dlq", "progress")}
    return TopicsConfig(**names, partitions=partitions)


def topics_file(topics: TopicsConfig, folder: Path) -> Path:
    """`topics` as the JSON file `--topics-config` reads."""
    path = folder / "topics.json"
    path.write_text(json.dumps(dataclasses.asdict(topics)))
    return path


@pytest.fixture(scope="session")
def tiny_engine() -> Any:
    pytest.importorskip("torch")
    from codeclog.vocoder.engine import Code2WavEngine

    return Code2WavEngine.from_spec("tiny")
