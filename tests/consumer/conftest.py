"""Fixtures for the Code2Wav consumer tests: topics per test, publishing, running `vocode`."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from codeclog.topics import ensure_topics
from codeclog.topics_config import TopicsConfig

ROOT = Path(__file__).resolve().parents[2]


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

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-3000:] for p in sorted(self.tmp.glob("*.log"))
        )


@pytest.fixture
def stack(
    kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path
) -> Iterator[Stack]:
    topics = TopicsConfig(
        chunks=unique_name("chunks"),
        audio=unique_name("audio"),
        dlq=unique_name("dlq"),
        progress=unique_name("progress"),
        partitions=4,
    )
    ensure_topics({"bootstrap.servers": kafka_bootstrap}, topics)
    topics_file = tmp_path / "topics.json"
    topics_file.write_text(json.dumps(dataclasses.asdict(topics)))
    result = Stack(kafka_bootstrap, topics, topics_file, unique_name("group"), tmp_path)
    yield result
    for process in result.processes:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="session")
def tiny_engine() -> Any:
    pytest.importorskip("torch")
    from codeclog.vocoder.engine import Code2WavEngine

    return Code2WavEngine.from_spec("tiny")
