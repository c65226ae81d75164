"""Mode 2: a talker chunk -> its audio at vllm-omni's final output, at 1 and 20 streams.

    ~/.cache/codeclog/omni-venv/bin/python -m bench.bench_return_path     # needs vllm-omni
    ... -m bench.bench_return_path --streams 1 20 --seconds 12 --bootstrap HOST:PORT

Run it with the Python of the vllm-omni environment (scripts/bootstrap.sh builds it; install
this checkout into it first: `pip install --no-deps --force-reinstall .`). One run, on one
broker (a local one unless --bootstrap), one `codeclog vocode` member (tiny vocoder, CPU):
the talker hook (`codeclog.producers.vllm_omni.TalkerHook`, what `tts2code2wav_kafka` runs)
is called as vllm-omni's talker adapter calls it, one codec id per stream per 40 ms step
(real time); the audio comes back through codeclog's relay (`omni.relay.AudioRelayClient`) in
the Code2Wav stage's place in vllm-omni 0.30's own orchestrator (codeclog.devtools.omni_server).

Latency of a window: the wall clock when the orchestrator's output message holding it was taken
(what `AsyncOmni.generate` would yield to the API server) minus `produced_at` of the window's
newest codec chunk (stamped by the hook's windowing). Rows: committed audio (the default) and
speculative (the live copies, docs/listening.md), at each stream count; p50 / p99 over every
window of the row, and of its last hop alone: the relay having the window -> the output message
(the return path's own cost; the rest is the talker, the broker and the member's decode).
No timed test asserts any of it (BENCHMARKS.md has the runs).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.local_broker import cluster

FRAME_S = 0.04  # one codec id per stream per step: 25 Hz, real time


def _request(rid: str) -> Any:
    """What the hook reads of a vLLM request (external id, status, is_finished)."""
    request = SimpleNamespace(external_req_id=rid, request_id=f"talker-{rid}", done=False)
    request.status = SimpleNamespace(name="RUNNING")
    request.is_finished = lambda: request.done
    return request


def _talk(hook: Any, server: Any, rids: list[str], steps: int) -> None:
    """Real-time steps of every stream through the hook, then each request's EOS step."""
    import torch

    requests = {rid: _request(rid) for rid in rids}
    start = time.monotonic()
    for step in range(steps + 1):
        time.sleep(max(0.0, start + step * FRAME_S - time.monotonic()))
        for n, rid in enumerate(rids):
            request = requests[rid]
            last = step == steps
            request.done = last
            ids = [] if last else [(n * 37 + step) % 6561]
            output = {"codes": {"audio": torch.tensor(ids, dtype=torch.long)}}
            hook(None, output, request, is_finished=last)
            if last:
                server.finish_upstream(rid)
    hook.publisher.flush(30)


def row(config: Any, streams: int, seconds: float, isolation: str) -> dict[str, Any]:
    from codeclog.devtools import omni_server
    from codeclog.devtools.stats import percentile
    from codeclog.omni import plugin
    from codeclog.omni.relay import AudioRelayClient
    from codeclog.producers.publisher import ChunkPublisher, PublisherConfig
    from codeclog.producers.vllm_omni import TalkerHook

    environment = {**config.environment, "CODECLOG_AUDIO_ISOLATION": isolation}
    metadata = SimpleNamespace(
        stage_id=2, engine_input_source=[1], default_sampling_params=None, model_stage="code2wav"
    )
    relay: AudioRelayClient = plugin.relay_for(SimpleNamespace(metadata=metadata), environment)
    # internal id -> (produced_at of the window's newest chunk, when the relay had it), in order
    produced: dict[str, list[tuple[float, float]]] = {}
    emit = relay._emit

    def recording(events: Any) -> None:
        now_ms = time.time() * 1000
        for event in events:
            if hasattr(event, "chunk"):
                times = (event.chunk.source_produced_at_ms, now_ms)
                produced.setdefault(event.request_id, []).append(times)
        emit(events)

    relay.audio.sink = recording
    server = omni_server.OmniServer(relay)
    run = uuid.uuid4().hex[:6]
    rids = [f"b{run}-{n}" for n in range(streams)]
    publisher = ChunkPublisher(
        config.client, PublisherConfig(config.topics.chunks, producer_id=run)
    )
    latencies: list[float] = []
    hops: list[float] = []  # the relay having the window -> the orchestrator's output
    seen: dict[str, int] = {}
    try:
        for rid in rids:
            server.submit(rid)
        time.sleep(1.0)  # every placeholder registered with the relay
        steps = int(seconds / FRAME_S)
        talker = threading.Thread(target=_talk, args=(TalkerHook(publisher), server, rids, steps))
        talker.start()  # the output is read while the talker talks
        finished: set[str] = set()
        deadline = time.monotonic() + seconds + 120
        while len(finished) < streams and time.monotonic() < deadline:
            for at, message in server.read_timed(0.2):
                now_ms = at * 1000
                if omni_server.is_error(message):
                    raise SystemExit(f"request failed: {message.error}")
                if not omni_server.is_audio(message):
                    continue
                windows, done, _rate = omni_server.audio_of(message)
                for _ in windows:
                    k = seen.get(message.request_id, 0)
                    produced_at, relayed_at = produced[message.request_id][k]
                    latencies.append(now_ms - produced_at)
                    hops.append(now_ms - relayed_at)
                    seen[message.request_id] = k + 1
                if done:
                    finished.add(message.request_id)
        talker.join()
    finally:
        server.close()
        publisher.close(10.0)
    return {
        "isolation": isolation,
        "streams": streams,
        "windows": len(latencies),
        "finished": len(finished),
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "hop_p50": percentile(hops, 50),
        "hop_p99": percentile(hops, 99),
    }


def line(result: dict[str, Any]) -> str:
    return (
        f"{result['isolation']:>11} audio, {result['streams']:>3} streams: "
        f"p50 {result['p50']:.0f} ms / p99 {result['p99']:.0f} ms; of which the relay to the "
        f"output {result['hop_p50']:.1f} / {result['hop_p99']:.1f} ms "
        f"({result['windows']} windows, {result['finished']} requests finished)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 20])
    parser.add_argument("--seconds", type=float, default=12.0, help="audio per stream")
    parser.add_argument(
        "--isolation", nargs="+", default=["committed", "speculative"], help="rows per count"
    )
    parser.add_argument("--bootstrap", help="a running cluster (default: a local broker)")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("vllm_omni") is None:
        parser.error("run it with the vllm-omni environment's Python (see --help)")
    logging.getLogger("codeclog").addHandler(logging.NullHandler())
    from codeclog.devtools.members import Members
    from codeclog.devtools.stack import write_topics_file
    from codeclog.kafka.topics import create_topics
    from codeclog.topics_config import TopicsConfig

    run = uuid.uuid4().hex[:6]
    with cluster(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as tmp:
        topics = TopicsConfig(
            chunks=f"rp-{run}.chunks",
            audio=f"rp-{run}.audio",
            dlq=f"rp-{run}.dlq",
            progress=f"rp-{run}.progress",
            partitions=4,
        )
        client = {"bootstrap.servers": bootstrap}
        create_topics(client, topics)
        members = Members(Path(tmp))
        member = members.start(
            "bench",
            "--bootstrap",
            bootstrap,
            "--topics-config",
            str(write_topics_file(topics, Path(tmp))),
            "--group",
            f"rp-{run}",
            "--vocoder",
            "tiny",
        )
        environment = {
            "CODECLOG_BOOTSTRAP": bootstrap,
            "CODECLOG_TOPIC": topics.chunks,
            "CODECLOG_AUDIO_TOPIC": topics.audio,
            "CODECLOG_DLQ_TOPIC": topics.dlq,
        }
        config = SimpleNamespace(client=client, topics=topics, environment=environment)
        try:
            members.wait_for_log(member, "assigned", 120)
            for streams in args.streams:
                for isolation in args.isolation:
                    print(line(row(config, streams, args.seconds, isolation)), flush=True)
        finally:
            members.kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
