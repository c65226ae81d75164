"""Two stages in two processes exchange 1,000 chunks of 50 requests through the connector,
across a restart of their (test-local) broker; a capture of the topic replays, strict, to the
report the fold gives on the same chunks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from codeclog.cli import main
from codeclog.consumers.stream.fold.report import build_report
from codeclog.consumers.stream.fold.state import FoldConfig, Policy
from codeclog.devtools.broker import BrokerSettings, LocalBroker
from codeclog.replay.capture_format import read_capture
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk
from tests.omni.stages import CHUNKS_PER_REQUEST, REQUESTS, chunks

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _spawn(role: str, bootstrap: str, topic: str, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.omni.stages", role, bootstrap, topic, str(out)],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        },
    )


def _sent(out: Path) -> int:
    try:
        return int((out / "sent.progress").read_text() or 0)
    except (OSError, ValueError):
        return 0


def test_two_processes_exchange_1000_chunks_across_a_broker_restart(
    tmp_path: Path, unique_name: Callable[[str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    broker = LocalBroker(
        tmp_path / "kb",
        BrokerSettings(
            heap_max_mb=512,
            start_timeout_s=120,
            die_with_parent=True,
            extra_jvm_args=("-XX:TieredStopAtLevel=1",),
        ),
    )
    topic = unique_name("omni-edge")
    sender = receiver = None
    try:
        bootstrap = broker.start().bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(30)
        receiver = _spawn("receiver", bootstrap, topic, tmp_path)
        sender = _spawn("sender", bootstrap, topic, tmp_path)
        deadline = time.monotonic() + 120
        sent = _sent(tmp_path)
        while sent < 400 and time.monotonic() < deadline:
            assert sender.poll() is None, "the sender died before the restart"
            time.sleep(0.05)
            sent = _sent(tmp_path)
        assert sent >= 400
        assert broker.stop().was_running
        time.sleep(1.0)  # puts block for their acks meanwhile
        assert broker.start().bootstrap == bootstrap  # same ports: the clients reconnect
        assert sender.wait(240) == 0
        assert receiver.wait(240) == 0
        sent_health = json.loads((tmp_path / "sent.done").read_text())
        result = json.loads((tmp_path / "received.json").read_text())

        expected = chunks()
        assert sent_health["puts"] == REQUESTS * CHUNKS_PER_REQUEST
        assert sent_health["failures"] == 0
        for rid, items in expected.items():  # every chunk once, in order per request
            got = result["received"][rid]
            assert [g["chunk_seq"] for g in got] == [c.chunk_seq for c in items]
            assert [g["codes"] for g in got] == [list(c.codes) for c in items]
            assert [g["finished"] for g in got] == [c.last_chunk for c in items]
        assert result["health"]["failures"] == 0

        capture = tmp_path / "edge.ocf"
        assert (
            main(["capture", "--bootstrap", bootstrap, "--topic", topic, "--out", str(capture)])
            == 0
        )
        _metadata, records, _ = read_capture(capture)
        assert len(records) == REQUESTS * CHUNKS_PER_REQUEST  # no duplicate from the restart
        capsys.readouterr()
        assert main(["replay", str(capture), "--policy", "strict", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
    finally:
        for process in (sender, receiver):
            if process is not None and process.poll() is None:
                process.kill()
        broker.stop()

    logged = [wire.decode(r.value) for r in sorted(records, key=lambda r: (r.partition, r.offset))]
    assert all(isinstance(chunk, CodecChunk) for chunk in logged)
    fold = build_report(logged, FoldConfig(policy=Policy.STRICT))
    assert {key: report[key] for key in fold} == fold
    by_request = {rid: [c.chunk_seq for c in items] for rid, items in expected.items()}
    assert {
        rid: [c.chunk_seq for c in logged if c.request_id == rid] for rid in by_request
    } == by_request  # type: ignore[union-attr]
