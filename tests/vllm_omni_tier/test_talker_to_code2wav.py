"""codeclog inside the released vllm-omni: the real chunk transfer adapter, the package's MiniCPM-o
processor and the real connector factory, on a real broker; SharedMemoryConnector, vllm-omni's
default, is the baseline in the same test (tests/vllm_omni_tier/pipeline.py says what is real)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pipeline as edge
from vllm_omni.distributed.omni_connectors.connectors.base import OmniConnectorBase
from vllm_omni.distributed.omni_connectors.factory import OmniConnectorFactory
from vllm_omni.distributed.omni_connectors.utils.config import ConnectorSpec

import codeclog
from codeclog.omni.connector import CodeclogKafkaConnector

# The four interleaved requests: 12 chunks of up to 25 new ids (3 of left context each)
FOUR = {"a": 112, "b": 75, "c": 26, "d": 3}


def _kafka(bootstrap: str, topic: str, **more: Any) -> dict[str, Any]:
    return edge.deploy_config("CodeclogKafkaConnector", edge.kafka_extra(bootstrap, topic, **more))


SHM = edge.deploy_config("SharedMemoryConnector", edge.shm_extra())


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "codeclog.cli", *args], capture_output=True, text=True, timeout=180
    )


def _replay(bootstrap: str, topic: str, folder: Path, policy: str) -> dict[str, Any]:
    capture = folder / f"{topic}.ocf"
    if not capture.exists():
        done = _cli("capture", "--topic", topic, "--out", str(capture), "--bootstrap", bootstrap)
        assert done.returncode == 0, done.stderr
    done = _cli("replay", str(capture), "--policy", policy, "--json")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_codeclog_is_the_installed_package_and_a_real_omni_connector(bootstrap: str) -> None:
    assert "site-packages" in codeclog.__file__  # as a vllm-omni user has it, not the checkout
    assert "CodeclogKafkaConnector" in OmniConnectorFactory.list_registered_connectors()
    spec = ConnectorSpec("CodeclogKafkaConnector", {"bootstrap": bootstrap, "stage_id": 2})
    connector = OmniConnectorFactory.create_connector(spec)
    try:
        assert isinstance(connector, CodeclogKafkaConnector)
        assert isinstance(connector, OmniConnectorBase)
        assert connector.stage_id == 2  # an int: the adapter computes stage_id - 1
        assert connector.deserialize_obj(connector.serialize_obj({"k": [1]})) == {"k": [1]}
        assert connector._make_key("r_1_0", "1", "2") == "r_1_0@1_2"
    finally:
        connector.close()


def test_every_chunk_arrives_once_in_order_equal_to_shared_memory(
    bootstrap: str, new_topic: Callable[[], str], tmp_path: Path
) -> None:
    streams = edge.unique_streams(FOUR)
    baseline, _ = edge.run_edge(SHM, streams)
    topic = new_topic()
    got, health = edge.run_edge(_kafka(bootstrap, topic), streams)
    assert sum(len(chunks) for chunks in baseline.values()) == 12
    assert got == baseline  # ids, positions and every meta field, nothing SHM leaves out added
    assert health["failures"] == 0 and health["gets"] == 12, health
    # the topic holds typed records the replay reads, every one of them
    for policy in ("strict", "tolerant"):
        report = _replay(bootstrap, topic, tmp_path, policy)
        assert report["events"] == 12 and report["dead_letters"]["total"] == 0, report
        assert report["stage"]["fatal"] is None
        assert {rid: r["status"] for rid, r in report["requests"].items()} == {
            rid: "released" for rid in streams
        }


def test_the_end_marker_of_an_aborted_request_finishes_it_as_shared_memory_does(
    bootstrap: str, new_topic: Callable[[], str], tmp_path: Path
) -> None:
    streams = edge.unique_streams({"kept": 60, "aborted": 40})
    aborted = next(rid for rid in streams if rid.startswith("aborted"))
    baseline, _ = edge.run_edge(SHM, streams, abort=(aborted,))
    topic = new_topic()
    got, health = edge.run_edge(_kafka(bootstrap, topic), streams, abort=(aborted,))
    assert got == baseline
    assert got[aborted][-1]["prompt_token_ids"] == []  # the adapter's own end marker, no codes
    assert health["failures"] == 0, health
    report = _replay(bootstrap, topic, tmp_path, "tolerant")
    assert report["dead_letters"]["total"] == 0, report  # the marker is a FINISH control event


def test_two_code2wav_replicas_each_get_the_requests_routed_to_them(
    bootstrap: str, new_topic: Callable[[], str]
) -> None:
    streams = edge.unique_streams({f"s{n}": 30 + n for n in range(8)})  # 16 chunks, 8 requests
    deploy = _kafka(bootstrap, new_topic(), request_idle_s=3)
    talker = edge.talker_adapter(deploy)
    replicas = [edge.Code2Wav(edge.code2wav_adapter(deploy, replica=n)) for n in (0, 1)]
    try:
        routed = {rid: replicas[n % 2] for n, rid in enumerate(streams)}
        for rid, replica in routed.items():
            replica.add(rid)
        edge.talk(talker, streams)
        edge.wait_sent(talker)
        deadline = time.monotonic() + 120
        while any(r.requests for r in replicas) and time.monotonic() < deadline:
            for replica in replicas:
                replica.step()
            time.sleep(0.002)
        for rid, replica in routed.items():
            assert rid in replica.finished and len(replica.chunks[rid]) == 2, rid
        groups = {r.adapter.connector.group_id for r in replicas}
        assert len(groups) == 2  # one consumer group per replica: each reads every partition
        # what a replica read of the other's requests is dropped: once the other replica's
        # marks on the hand-out ledger say they ended there, or after request_idle_s unasked
        time.sleep(3 + 2 * 2.0)  # request_idle_s, plus the expiry's period twice
        for replica in replicas:
            health = replica.adapter.connector.health()
            assert health["index_entries"] == 0 and health["index_requests"] == 0, health
            dropped = health.get("ended_elsewhere", 0) + health.get("expired", 0) // 2
            assert dropped == 4, health  # the other replica's 4 requests (2 chunks each)
    finally:
        talker.shutdown()
        for replica in replicas:
            replica.adapter.shutdown()


def test_receiver_memory_is_bounded_over_1000_requests(
    bootstrap: str, new_topic: Callable[[], str]
) -> None:
    deploy = _kafka(bootstrap, new_topic())
    talker = edge.talker_adapter(deploy)
    code2wav = edge.Code2Wav(edge.code2wav_adapter(deploy))
    kept = []
    try:
        for batch in range(10):
            streams = edge.unique_streams(
                {f"m{batch}-{n}": 5 for n in range(100)}
            )  # one chunk each
            for rid in streams:
                code2wav.add(rid)
            edge.talk(talker, streams)
            edge.wait_sent(talker)
            code2wav.run()
            health = code2wav.adapter.connector.health()
            kept.append((health["index_entries"], health["index_requests"], health["handed_keys"]))
            code2wav.chunks.clear()
        assert health["gets"] == 1000 and health["finished"] == 1000, health
        assert kept == [(0, 0, 0)] * 10  # nothing kept of a finished request, after every 100
    finally:
        talker.shutdown()
        code2wav.adapter.shutdown()


def test_a_put_is_there_for_the_get_that_follows_it(
    bootstrap: str, new_topic: Callable[[], str]
) -> None:
    topic = new_topic()
    group = f"put-get-{uuid.uuid4().hex[:8]}-stage{{stage}}"  # one receiving group per stage
    extra = {"bootstrap": bootstrap, "topic": topic, "stage_id": 1}
    one = OmniConnectorFactory.create_connector(
        ConnectorSpec("CodeclogKafkaConnector", {**extra, "group_id": group.format(stage=1)})
    )
    receiving = {**extra, "stage_id": 2, "role": "receiver", "group_id": group.format(stage=2)}
    receiver = OmniConnectorFactory.create_connector(
        ConnectorSpec("CodeclogKafkaConnector", receiving)
    )
    try:
        # one connector, put then get at once (upstream's connector-generic tests do this)
        for key, value in (("r_1_0", {"x": [1, 2]}), ("r_1_1", 0), ("r_1_2", {})):
            assert one.put("1", "2", key, value)[0]
            got = one.get("1", "2", key)
            assert got is not None and got[0] == value, (key, one.health())
        # another process's put, polled the way the adapter polls (every few milliseconds)
        assert one.put("1", "2", "q_1_0", {"v": 7})[0]
        deadline = time.monotonic() + 30
        got = None
        while got is None and time.monotonic() < deadline:
            got = receiver.get("1", "2", "q_1_0")
            time.sleep(0.005)
        assert got is not None and got[0] == {"v": 7}, receiver.health()
    finally:
        one.close()
        receiver.close()


def test_the_seed_incident_through_the_real_adapter_strict_reproduces_tolerant_decodes(
    bootstrap: str, new_topic: Callable[[], str], tmp_path: Path
) -> None:
    """A resumable request's second segment (cache epoch 1) loses its admitting chunk's
    metadata as vllm-omni's runner lost it (edge.admitting_chunk_stripped); the log then holds
    what the upstream Code2Wav read. Replayed strictly it dies as the upstream died (#7979);
    the product's fold decodes the request."""
    topic = new_topic()
    talker = edge.talker_adapter(_kafka(bootstrap, topic))
    talker.custom_process_next_stage_input_func = edge.admitting_chunk_stripped(
        talker.custom_process_next_stage_input_func
    )
    rid = f"r1-{uuid.uuid4().hex[:8]}"
    try:
        edge.talk_segments(talker, rid, [list(range(10, 40)), list(range(50, 110))])
        edge.wait_sent(talker)
    finally:
        talker.shutdown()
    strict = _replay(bootstrap, topic, tmp_path, "strict")
    assert strict["stage"]["fatal"] == {
        "cache_epoch": 1,
        "chunk_seq": 1,
        "reason": "new_epoch_requires_first_chunk",
        "request_id": rid,
    }
    tolerant = _replay(bootstrap, topic, tmp_path, "tolerant")
    assert tolerant["stage"]["fatal"] is None and tolerant["dead_letters"]["total"] == 1
    outcomes = tolerant["requests"][rid]["outcomes"]
    decoded = [o for o in outcomes if o["kind"] == "decode" and o["cache_epoch"] == 1]
    assert decoded and decoded[-1]["final"], outcomes
