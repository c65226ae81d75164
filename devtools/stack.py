"""One run's topics and group on a cluster, and what drives them: the tests' `Stack`."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

from codeclog.devtools.members import MemberError, Members, group_drained, stop_once_committed
from codeclog.devtools.talker import LiveTalker, Speech, Voice, publish_sessions
from codeclog.producers.publisher import PublisherConfig
from codeclog.topics_config import TopicsConfig


def write_topics_file(topics: TopicsConfig, folder: Path) -> Path:
    """`topics` as the JSON file `--topics-config` reads (folder/topics.json)."""
    path = folder / "topics.json"
    path.write_text(json.dumps(dataclasses.asdict(topics)))
    return path


@dataclasses.dataclass
class Stack:
    """One run's topics (and their `topics_file`) and consumer group on the cluster at
    `bootstrap`; members it starts log into `tmp`. `client` is what its own clients use."""

    bootstrap: str
    topics: TopicsConfig
    topics_file: Path
    group: str
    tmp: Path
    members: Members = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.members = Members(self.tmp)

    @property
    def client(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    @property
    def processes(self) -> list[subprocess.Popen[bytes]]:
        return self.members.processes

    @property
    def log_of(self) -> dict[int, Path]:
        return self.members.log_of

    def publish_sessions(self, sessions: int, seconds: float, seed: int) -> int:
        """Synthetic duplex sessions, published as fast as possible; returns records sent."""
        return publish_sessions(self.client, self.topics.chunks, Speech(sessions, seconds, seed))

    def live_talker(
        self,
        speech: Speech,
        *,
        producer_id: str = "live-talker",
        close_s: float = 60.0,
        **publisher: Any,
    ) -> LiveTalker:
        """A started LiveTalker on the chunk topic: one ChunkPublisher through the run, closed
        with `close_s` to deliver what it holds; `publisher`: more PublisherConfig fields."""
        config = PublisherConfig(topic=self.topics.chunks, producer_id=producer_id, **publisher)
        talker = LiveTalker(Voice(self.client, config), speech, close_s=close_s)
        talker.start()
        return talker

    def vocode(self, instance: str, *extra: str, idle_s: float = 4.0) -> subprocess.Popen[bytes]:
        """Start `codeclog vocode` as its own process in this stack's group (it can be
        SIGKILLed); it exits once idle for `idle_s`."""
        cluster = ["--bootstrap", self.bootstrap, "--topics-config", str(self.topics_file)]
        group = ["--group", self.group, "--exit-when-idle", str(idle_s)]
        return self.members.start(instance, *cluster, *group, *extra)

    def wait_for_log(self, process: subprocess.Popen[bytes], text: str, timeout_s: float) -> None:
        """Wait until the process logged `text` (e.g. its partitions were assigned)."""
        try:
            self.members.wait_for_log(process, text, timeout_s)
        except MemberError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None

    def committed_everything(self) -> bool:
        """The group's committed offsets are at the end of every chunk partition."""
        return not group_drained(self.client, self.group, self.topics.chunks)

    def stop_once_committed(self, process: subprocess.Popen[bytes], timeout_s: float) -> int:
        """SIGTERM a member once its group committed everything (rather than wait out its idle
        exit); its exit code. One that exits first (or never gets there) is waited for."""
        return stop_once_committed(
            process, lambda: group_drained(self.client, self.group, self.topics.chunks), timeout_s
        )

    def kill_processes(self) -> None:
        """SIGKILL every process this stack started that still runs (test teardown)."""
        self.members.kill_all()

    def logs(self) -> str:
        return self.members.tail()
