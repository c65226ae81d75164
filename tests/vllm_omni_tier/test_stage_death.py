"""When a stage process dies, inside the released vllm-omni: the real chunk adapters, each stage
in a process of its own (stage_procs.py), SIGKILLed mid-request.

- A Code2Wav receiver replaced under the same replica identity hands out every request that
  had not ended from chunk 0, whole and equal to an undisturbed run, and none whose end reached
  the hand-out ledger; it takes its partitions over at once (static membership), not after the
  dead member's session.
- A replica that dies for good: its requests, re-submitted to another replica of the edge, are
  handed out there from chunk 0.
- A talker that dies mid-request: each of its unfinished requests fails at the Code2Wav side
  within `request_wait_s`, through the adapter (FINISHED_ERROR, the reason in health()); a late
  chunk of one is dropped and counted. The same when the broker is out of reach.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pipeline as edge
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from codeclog.devtools.broker import BrokerSettings, LocalBroker
from codeclog.omni.ledger import ledger_topic
from codeclog.schemas import wire
from codeclog.schemas.records import HandOutMark

HERE = Path(__file__).resolve().parent
SHM = edge.deploy_config("SharedMemoryConnector", edge.shm_extra())
# ids per request before EOS: 1 to 8 chunks, so some requests end early and some are near
# their end whenever the receiver dies
LENGTHS = (3, 26, 60, 112, 150, 200)
PACE_S = 0.03  # between talker steps: 200 steps take 6 s
# a session far longer than any test: a replacement that waited for it would time the test out
SESSION = {"kafka": {"session.timeout.ms": 300_000}}


def _group() -> str:
    """A receiver group prefix of one test (static members outlive their process)."""
    return f"code2wav-{uuid.uuid4().hex[:8]}"


def _streams(count: int) -> dict[str, list[int]]:
    return edge.unique_streams({f"s{n}": LENGTHS[n % len(LENGTHS)] for n in range(count)})


def _spec(
    out: Path, bootstrap: str, topic: str, streams: dict[str, list[int]], group: str, **more: Any
) -> Path:
    spec = {
        "bootstrap": bootstrap,
        "topic": topic,
        "out": str(out),
        "streams": streams,
        "pace_s": PACE_S,
        "extra": {"group_id": group, **SESSION},
        **more,
    }
    path = out / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def _json(value: Any) -> Any:
    """As it reads back from a stage process's JSON (tuples become lists)."""
    return json.loads(json.dumps(value))


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(HERE / "stage_procs.py"), *args], cwd=HERE)


def _handed(out: Path, name: str) -> dict[str, list[dict[str, Any]]]:
    """What the connector of process `name` handed out, per request, in order."""
    path = out / f"handed-{name}.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    handed: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        if line.endswith("}"):  # a line cut by the kill is not a payload handed out
            item = json.loads(line)
            handed.setdefault(item["key"].rsplit("_", 2)[0], []).append(item)
    return handed


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _done(out: Path, name: str, process: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert process.wait(240) == 0, f"{name} exited {process.returncode}"
    done: dict[str, Any] = json.loads((out / f"{name}.done").read_text())
    return done


def _marked(bootstrap: str, topic: str, group: str, process: subprocess.Popen[bytes]) -> set[str]:
    """The requests whose end the receiver in `process` (of `group`) put on the edge's
    hand-out ledger."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": False}
    )
    try:
        tp = TopicPartition(ledger_topic(topic), 0, 0)
        _low, high = consumer.get_watermark_offsets(tp, timeout=30)
        consumer.assign([tp])
        marks: set[str] = set()
        seen = 0
        while seen < high:
            for message in consumer.consume(100, 1.0):
                if message.error() is None:
                    seen = message.offset() + 1
                    mark = wire.decode(message.value())
                    if (
                        isinstance(mark, HandOutMark)
                        and mark.consumer_group == group
                        and mark.producer_id == f"omni-{process.pid}"
                    ):
                        marks.add(mark.request_id)
        return marks
    finally:
        consumer.close()


def _mid_request(handed: dict[str, list[dict[str, Any]]], streams: dict[str, list[int]]) -> bool:
    """Some requests ended at the receiver and some are in flight: a moment to kill it."""
    ended = [rid for rid, items in handed.items() if items[-1]["finished"]]
    in_flight = [rid for rid, items in handed.items() if not items[-1]["finished"]]
    return len(ended) >= 2 and len(in_flight) >= len(streams) // 3


def _kill(process: subprocess.Popen[bytes]) -> float:
    os.kill(process.pid, signal.SIGKILL)
    process.wait(30)
    return time.time()


def test_a_replaced_code2wav_receiver_hands_out_every_unfinished_request_from_chunk_0(
    bootstrap: str, new_topic: Callable[[], str], tmp_path: Path
) -> None:
    streams = _streams(24)
    baseline = _json(edge.run_edge(SHM, streams)[0])  # the undisturbed run
    topic = new_topic()
    group = _group()
    spec = _spec(tmp_path, bootstrap, topic, streams, group)
    first = _spawn("code2wav", str(spec), "a", "0")
    talker = _spawn("talker", str(spec))
    try:
        _wait(lambda: _mid_request(_handed(tmp_path, "a"), streams), 120, "requests in flight")
        killed_at = _kill(first)
        before = _handed(tmp_path, "a")
        # vllm-omni 0.30 fails a dead replica's requests; a re-submission gives the new process
        # every request of the old one, as the experiment did (docs/vllm-omni.md)
        replacement = _spawn("code2wav", str(spec), "b", "0")
        done = _done(tmp_path, "b", replacement)
        assert talker.wait(120) == 0
    finally:
        for process in (first, talker):
            if process.poll() is None:
                process.kill()
    after = _handed(tmp_path, "b")
    marked = _marked(bootstrap, topic, f"{group}-replica0", first)
    ended = {rid for rid, items in before.items() if items[-1]["finished"]}
    # a mark is written once the terminal was handed out, never before; the kill may fall after
    # a get handed a terminal out (the receiver then marks it) and before the log line of it was
    # written (stage_procs._logged): at most that one get, the one in progress (seen once in the
    # 10-run stress of docs/testing.md)
    assert len(marked - ended) <= 1, marked - ended
    in_flight = set(streams) - marked
    assert len(ended) >= 2 and len(in_flight) >= 8, (ended, in_flight)
    for rid in in_flight:  # handed out again from chunk 0, whole, as undisturbed
        assert done["chunks"][rid] == baseline[rid], rid
        assert after[rid][0]["key"].endswith("_1_0"), rid
    for rid in marked:  # ended before the kill: never handed out again, failed if asked for
        assert rid not in after, rid
    assert sorted(done["failed"]) == sorted(marked)
    assert sorted(done["finished"]) == sorted(in_flight)
    health = done["health"]
    assert set(health["failed_requests"]) == marked
    assert all(
        "ended on this edge before (finished)" in r for r in health["failed_requests"].values()
    )
    assert health["index_entries"] == 0 and health["index_requests"] == 0, health
    first_handed = min(item["at"] for items in after.values() for item in items)
    # the new member took the dead one's partitions over at once: its session was 300 s
    assert first_handed - killed_at < 120


def test_a_dead_replica_s_requests_re_submitted_to_another_replica_are_handed_out_there(
    bootstrap: str, new_topic: Callable[[], str], tmp_path: Path
) -> None:
    streams = _streams(24)
    baseline = _json(edge.run_edge(SHM, streams)[0])
    topic = new_topic()
    group = _group()
    spec = _spec(tmp_path, bootstrap, topic, streams, group, more=True)
    routed = {rid: n % 2 for n, rid in enumerate(streams)}
    for name, replica in (("a", 0), ("c", 1)):
        mine = [rid for rid, r in routed.items() if r == replica]
        (tmp_path / f"requests-{name}.json").write_text(json.dumps(mine))
    dead = _spawn("code2wav", str(spec), "a", "0")
    other = _spawn("code2wav", str(spec), "c", "1")
    talker = _spawn("talker", str(spec))
    try:
        dead_streams = {rid: ids for rid, ids in streams.items() if routed[rid] == 0}
        _wait(lambda: _mid_request(_handed(tmp_path, "a"), dead_streams), 120, "in flight")
        _kill(dead)
        # what ended at the dead replica: its marks on the ledger when the requests move
        marked = _marked(bootstrap, topic, f"{group}-replica0", dead)
        # a naive re-routing of the dead replica's requests, ended ones included (0.30 fails
        # them; the plugin's re-dispatch moves only the unfinished: test_redispatch.py)
        (tmp_path / "more-c.json").write_text(json.dumps(list(dead_streams)))
        done = _done(tmp_path, "c", other)
        assert talker.wait(120) == 0
    finally:
        for process in (dead, talker, other):
            if process.poll() is None:
                process.kill()
    for rid in streams:
        if routed[rid] == 1 or rid not in marked:  # its own, and the dead one's unfinished
            assert done["chunks"][rid] == baseline[rid], rid
    assert sorted(done["failed"]) == sorted(marked)  # ended at the dead replica: not again
    assert done["health"]["index_entries"] == 0


def test_a_talker_killed_mid_request_fails_its_requests_within_the_wait_bound(
    bootstrap: str, new_topic: Callable[[], str], tmp_path: Path
) -> None:
    streams = _streams(12)
    topic = new_topic()
    group = _group()
    spec = _spec(tmp_path, bootstrap, topic, streams, group)
    # the bound counts from the adapter's first ask: 8 s, so that a receiver starved by a loaded
    # machine (the stress of docs/testing.md, load 12 on 2 cores) still serves what the log holds
    extra = edge.kafka_extra(bootstrap, topic, request_wait_s=8, group_id=group)
    deploy = edge.deploy_config("CodeclogKafkaConnector", extra)
    stage = edge.Code2Wav(edge.code2wav_adapter(deploy))
    talker = _spawn("talker", str(spec))
    try:
        for rid in streams:
            stage.add(rid)
        progress = tmp_path / "talker.progress"
        # steps 30..60: the 3- and 26-id requests ended, the others are mid-stream
        # (its imports first: a minute and more on a loaded machine; no bound is under test here)
        _wait(lambda: progress.exists() and int(progress.read_text() or 0) >= 40, 240, "steps")
        killed_at = time.monotonic()
        os.kill(talker.pid, signal.SIGKILL)
        talker.wait(30)
        stage.run(timeout_s=60)
        ended_after_s = time.monotonic() - killed_at
        health = stage.adapter.connector.health()
        cut = sorted(stage.failed)
        assert cut and sorted(stage.finished + cut) == sorted(streams)
        assert all(len(streams[rid]) > 26 for rid in cut)  # only requests the talker left open
        assert set(health["failed_requests"]) == set(cut)
        assert all("request_wait_s" in reason for reason in health["failed_requests"].values())
        assert health["timed_out"] == len(cut) and health["failed_through_adapter"] == len(cut)
        assert ended_after_s < 60  # vllm-omni's own stall timer would have taken 600 s
        # a late chunk of a failed request (its talker came back) is dropped, never handed out
        late = edge.talker_adapter(deploy)
        late.put_req_chunk[cut[0]] = 9  # its put counter past what it had sent
        edge.talk(late, {cut[0]: streams[cut[0]][:30]}, unfinished=(cut[0],))
        edge.wait_sent(late)
        late.shutdown()
        connector = stage.adapter.connector
        _wait(lambda: connector.health().get("late_dropped", 0) >= 1, 60, "the late chunk")
        assert connector.health()["index_entries"] == 0
    finally:
        if talker.poll() is None:
            talker.kill()
        stage.adapter.shutdown()


def test_a_request_whose_chunks_stop_with_the_broker_out_of_reach_fails_within_the_bound(
    tmp_path: Path,
) -> None:
    broker = LocalBroker(
        tmp_path / "kb",
        BrokerSettings(heap_max_mb=512, start_timeout_s=120, die_with_parent=True),
    )
    bootstrap = broker.start().bootstrap
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("edge", 2, 1)])["edge"].result(30)
        deploy = edge.deploy_config(
            "CodeclogKafkaConnector", edge.kafka_extra(bootstrap, "edge", request_wait_s=3)
        )
        streams = edge.unique_streams({"cut": 100})
        (rid,) = streams
        talker = edge.talker_adapter(deploy)
        stage = edge.Code2Wav(edge.code2wav_adapter(deploy))
        try:
            stage.add(rid)
            edge.talk(talker, {rid: streams[rid][:60]}, unfinished=(rid,))  # its first chunks
            edge.wait_sent(talker)
            deadline = time.monotonic() + 60
            while not stage.chunks[rid] and time.monotonic() < deadline:
                stage.step()
                time.sleep(0.002)
            assert stage.chunks[rid], stage.adapter.connector.health()
            assert broker.stop().was_running
            stage.run(timeout_s=60)
            assert stage.failed == [rid]
            reason = stage.adapter.connector.health()["failed_requests"][rid]
            assert "request_wait_s" in reason
        finally:
            talker.shutdown()
            stage.adapter.shutdown()
    finally:
        broker.stop()
