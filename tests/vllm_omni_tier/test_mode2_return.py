"""Mode 2 end to end, inside the released vllm-omni: the talker hook on the real talker adapter,
`codeclog vocode` members on a real broker, and the audio back at vllm-omni's final output
through codeclog's relay in the Code2Wav stage's place, in the package's own orchestrator
(orchestration.py says what is real). The deploy is the one docs/vllm-omni.md shows."""

from __future__ import annotations

import importlib
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pipeline as edge
import pytest
import yaml

from codeclog.consumers.readers.listener import AudioListener, Isolation, StartMode
from codeclog.devtools import omni_server as omni
from codeclog.devtools.stack import Stack, write_topics_file
from codeclog.kafka.topics import create_topics
from codeclog.omni import plugin
from codeclog.omni.relay import AudioRelayClient, pcm_of
from codeclog.producers.publisher import ChunkPublisher, PublisherConfig
from codeclog.producers.vllm_omni import TalkerHook
from codeclog.schemas.records import CodecChunk
from codeclog.topics_config import TopicsConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "vllm-omni.md"
SHM = edge.deploy_config("SharedMemoryConnector", edge.shm_extra())
LENGTHS = (3, 26, 60, 112, 150, 200)  # codec ids per request: 1 to 8 windows


def documented_deploy() -> dict[str, Any]:
    """The YAML block of docs/vllm-omni.md's "Mode 2 end to end"."""
    text = DOC.read_text()
    section = text[text.index("### Mode 2 end to end") :]
    block = section[section.index("```yaml") + len("```yaml") : section.index("```\n", 10)]
    deploy: dict[str, Any] = yaml.safe_load(block)
    return deploy


@pytest.fixture
def cluster(bootstrap: str, tmp_path: Path) -> Any:
    """The documented deploy's environment on this broker, with topics of this test."""
    run = uuid.uuid4().hex[:8]
    topics = TopicsConfig(
        chunks=f"m2-{run}.chunks",
        audio=f"m2-{run}.audio",
        dlq=f"m2-{run}.dlq",
        progress=f"m2-{run}.progress",
        partitions=4,
    )
    client = {"bootstrap.servers": bootstrap}
    create_topics(client, topics)
    environment = {
        **documented_deploy()["environment"],
        "CODECLOG_BOOTSTRAP": bootstrap,
        "CODECLOG_TOPIC": topics.chunks,
        "CODECLOG_AUDIO_TOPIC": topics.audio,
        "CODECLOG_DLQ_TOPIC": topics.dlq,
    }
    stack = Stack(bootstrap, topics, write_topics_file(topics, tmp_path), f"m2-{run}", tmp_path)
    yield SimpleNamespace(client=client, topics=topics, environment=environment, stack=stack)
    stack.kill_processes()


def _relay(environment: dict[str, str], **overrides: str) -> AudioRelayClient:
    """The client the plugin builds for the return stage (from the stage's init plan)."""
    stage = int(environment["CODECLOG_RETURN_STAGE"])
    metadata = SimpleNamespace(
        stage_id=stage,
        engine_input_source=[stage - 1],
        default_sampling_params=None,
        model_stage="code2wav",
    )
    relay = plugin.relay_for(SimpleNamespace(metadata=metadata), {**environment, **overrides})
    assert isinstance(relay, AudioRelayClient)
    return relay


def _talker(cluster: Any) -> tuple[Any, TalkerHook]:
    """The talker stage's real adapter with the documented processor's hook."""
    deploy = documented_deploy()
    (talker_stage,) = [s for s in deploy["stages"] if s["stage_id"] == edge.TALKER]
    module, name = talker_stage["custom_process_next_stage_input_func"].rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module), name))
    config = PublisherConfig(cluster.topics.chunks, producer_id=f"talker-{uuid.uuid4().hex[:6]}")
    # what tts2code2wav_kafka's default_hook builds from the environment, for this test's topic
    hook = TalkerHook(ChunkPublisher(cluster.client, config))
    adapter = edge.talker_adapter(SHM)
    adapter.custom_process_next_stage_input_func = hook
    return adapter, hook


def _topic_audio(cluster: Any, requests: list[str]) -> dict[str, list[bytes]]:
    """Each request's windows as the audio topic holds them (committed, every epoch)."""
    listener = AudioListener(
        cluster.client,
        cluster.topics.audio,
        isolation=Isolation.COMMITTED,
        requests=requests,
        start=StartMode.BEGINNING,
    )
    windows: dict[str, list[bytes]] = {rid: [] for rid in requests}
    deadline = time.monotonic() + 60
    while not listener.caught_up() and time.monotonic() < deadline:
        for chunk in listener.poll(0.2):
            if chunk.pcm:
                windows[chunk.request_id].append(chunk.pcm)
    listener.close()
    return windows


def _served(server: omni.OmniServer, requests: list[str], timeout_s: float) -> dict[str, Any]:
    """Read the orchestrator until every request finished or failed at the audio stage."""
    windows: dict[str, list[bytes]] = {rid: [] for rid in requests}
    finished: set[str] = set()
    errors: dict[str, str] = {}
    rates: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(finished) + len(errors) < len(requests) and time.monotonic() < deadline:
        for message in server.read(0.5):
            if omni.is_error(message):
                errors[message.request_id] = message.error
            elif omni.is_audio(message):
                waveforms, done, rate = omni.audio_of(message)
                windows[message.request_id] += [pcm_of(w) for w in waveforms]
                rates |= {rate} if rate is not None else set()
                if done:
                    finished.add(message.request_id)
    return {"windows": windows, "finished": finished, "errors": errors, "rates": rates}


def _upstream_done(server: omni.OmniServer, streams: dict[str, list[int]]) -> Any:
    """The talk's step callback: each request's thinker and talker finish at its EOS step, as
    in vllm-omni (Code2Wav's last window comes after the talker's last step)."""

    def on_step(steps: int) -> None:
        for rid, ids in streams.items():
            if steps == len(ids) + 1:
                server.finish_upstream(rid)

    return on_step


def test_the_documented_deploy_installs_the_relay_for_its_return_stage(cluster: Any) -> None:
    deploy = documented_deploy()
    (code2wav,) = [s for s in deploy["stages"] if s["stage_id"] == omni.CODE2WAV]
    assert code2wav["final_output"] is True and code2wav["final_output_type"] == "audio"
    assert deploy["environment"]["CODECLOG_RETURN_STAGE"] == str(omni.CODE2WAV)
    assert deploy["vocode"].startswith("codeclog vocode ")
    runtime = importlib.import_module(plugin.RUNTIME_MODULE).StageRuntime
    before = runtime._initialize_replica
    try:
        assert plugin.install_return_stage(cluster.environment)
        plan = SimpleNamespace(
            replica_id=0,
            metadata=SimpleNamespace(
                stage_id=omni.CODE2WAV,
                engine_input_source=[1],
                default_sampling_params=None,
                model_stage="code2wav",
            ),
        )
        relay = runtime._initialize_replica(object(), plan, 60)  # the stage runtime's call
        assert isinstance(relay, AudioRelayClient) and relay.final_output_type == "audio"
        relay.shutdown()
    finally:
        runtime._initialize_replica = before
        delattr(runtime, plugin.BOUND)


def test_mode2_audio_reaches_vllm_omni_s_output_once_through_a_member_kill(cluster: Any) -> None:
    stack = cluster.stack
    members = [stack.vocode(name, "--vocoder", "tiny", idle_s=120) for name in ("a", "b")]
    streams = edge.unique_streams({f"m{n}": LENGTHS[n % len(LENGTHS)] for n in range(20)})
    requests = list(streams)
    relay = _relay(cluster.environment)
    server = omni.OmniServer(relay)
    adapter, hook = _talker(cluster)
    try:
        for rid in requests:
            server.submit(rid)
        talking = threading.Thread(
            target=edge.talk,
            args=(adapter, streams),
            kwargs={"pace_s": 0.05, "on_step": _upstream_done(server, streams)},
        )
        talking.start()
        deadline = time.monotonic() + 120
        while relay.audio.router.counts["windows"] < 10 and time.monotonic() < deadline:
            time.sleep(0.05)  # audio flows back: a member dies mid-run
        at_kill = dict(relay.audio.router.counts)
        stack.members.kill(members[0])
        talking.join(120)
        edge.wait_sent(adapter)
        hook.publisher.flush(30)
        served = _served(server, requests, timeout_s=150)
    finally:
        adapter.shutdown()
        server.close()
    assert served["errors"] == {}, served["errors"]
    missing = sorted(set(requests) - served["finished"])
    assert not missing, (missing, relay.audio.router.counts, stack.logs())
    assert at_kill["windows"] >= 10 and at_kill["finished"] < len(requests), at_kill
    assert served["rates"] == {24000}
    on_topic = _topic_audio(cluster, requests)
    for rid in requests:  # byte-identical, each window once, none missing
        assert served["windows"][rid] == on_topic[rid], rid
        assert on_topic[rid], rid
    verify = subprocess.run(
        [
            sys.executable,
            "-m",
            "codeclog.cli",
            "verify",
            "--bootstrap",
            stack.bootstrap,
            "--topics-config",
            str(stack.topics_file),
            "--group",
            stack.group,
            "--vocoder",
            "tiny",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-2000:]


def test_a_dead_lettered_chunk_and_a_silent_talker_fail_their_requests_with_the_reason(
    cluster: Any,
) -> None:
    stack = cluster.stack
    stack.vocode("a", "--vocoder", "tiny", idle_s=120)
    streams = edge.unique_streams({"good": 60, "poisoned": 112, "cut": 150})
    good, poisoned, cut = streams
    server = omni.OmniServer(_relay(cluster.environment, CODECLOG_REQUEST_WAIT_S="6"))
    adapter, hook = _talker(cluster)
    try:
        for rid in streams:
            server.submit(rid)
        # the talker stops `cut` half way; `poisoned` gets a chunk the fold refuses instead of
        # its end
        half = {cut: streams[cut][:75]}
        edge.talk(adapter, {**streams, **half}, unfinished=(cut, poisoned))
        edge.wait_sent(adapter)
        bad = CodecChunk(poisoned, (1, 2, 99_999), chunk_seq=40, codec_left_context_frames=3)
        hook.publisher.publish(bad)  # a codec id outside 0..6560: dead-lettered
        hook.publisher.flush(30)
        for rid in streams:
            server.finish_upstream(rid)
        served = _served(server, list(streams), timeout_s=180)
    finally:
        adapter.shutdown()
        server.close()
    assert served["finished"] == {good}
    errors = served["errors"]
    assert set(errors) == {poisoned, cut}
    assert "dead-lettered" in errors[poisoned] and poisoned in errors[poisoned]
    assert "no audio for 6 s" in errors[cut]
    assert served["windows"][good] == _topic_audio(cluster, [good])[good]
