"""A dead Code2Wav replica costs no request, inside the released vllm-omni's own orchestrator
(mode 1): the package's `Orchestrator` and `StagePool`s (devtools/omni_server.py), two Code2Wav
replicas each a process of its own with the real chunk adapter and connector (replica_client.py,
stage_procs.py), the real talker adapter in a third process, a real broker. One replica is
SIGKILLed with its requests in flight; codeclog's plugin (omni.redispatch) moves them to the
other, whose receiver asks from chunk 0; each request finishes at the orchestrator's output
with the codes of an undisturbed run, none twice, none lost. `redispatch: false` keeps
vllm-omni 0.30's behaviour: the dead replica's requests fail.
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
import pytest
from replica_client import ReplicaClient, codes_of
from test_stage_death import _marked, _spec

from codeclog.devtools import omni_server as omni
from codeclog.omni import redispatch

HERE = Path(__file__).resolve().parent
SHM = edge.deploy_config("SharedMemoryConnector", edge.shm_extra())
# ids per request before EOS: mostly long, so that most of a replica's requests are in flight
# when it dies, some ended and some near their end
LENGTHS = (3, 60, 112, 150, 200, 240, 180)  # 7: each replica gets some of every length
REQUESTS = 52  # 26 per replica (the orchestrator alternates)
REPORT = "CODECLOG_REDISPATCH_REPORT"  # a file the main test writes its measures to


class Served:
    """What the orchestrator's output gave each request: its codes, step by step, its end."""

    def __init__(self, requests: list[str]) -> None:
        self.codes: dict[str, list[list[int]]] = {rid: [] for rid in requests}
        self.finished: dict[str, float] = {}
        self.seen_at: dict[str, list[float]] = {rid: [] for rid in requests}  # per output
        self.errors: dict[str, str] = {}

    def take(self, messages: list[Any]) -> None:
        for message in messages:
            if omni.is_error(message):
                self.errors[message.request_id] = message.error
            elif omni.is_audio(message):
                waveforms, done, _rate = omni.audio_of(message)
                self.codes[message.request_id] += [codes_of(w) for w in waveforms if len(w)]
                self.seen_at[message.request_id].append(time.time())
                if done:
                    self.finished[message.request_id] = time.time()

    @property
    def ended(self) -> int:
        return len(self.finished) + len(self.errors)


def _run(
    bootstrap: str, topic: str, tmp_path: Path, streams: dict[str, list[int]], **extra: Any
) -> dict[str, Any]:
    """The pipeline with two Code2Wav replicas; replica 0 SIGKILLed mid-run."""
    group = f"code2wav-{uuid.uuid4().hex[:8]}"
    spec = _spec(tmp_path, bootstrap, topic, streams, group)
    replicas = [ReplicaClient(spec, "a", 0), ReplicaClient(spec, "b", 1)]
    connector = {
        "name": "CodeclogKafkaConnector",
        "extra": {**edge.kafka_extra(bootstrap, topic, group_id=group), **extra},
    }
    server = omni.OmniServer(replicas, connector)
    served = Served(list(streams))
    talker: subprocess.Popen[bytes] | None = None
    try:
        for rid in streams:
            server.submit(rid)
            server.finish_upstream(rid)  # the thinker and talker engines' part is done
        for replica in replicas:
            assert replica.ready.wait(120), f"replica {replica.name} did not start"
        talker = subprocess.Popen(
            [sys.executable, str(HERE / "stage_procs.py"), "talker", str(spec)], cwd=HERE
        )
        dead = replicas[0]
        _until(server, served, lambda: _mid_run(served, dead.added), 120, "requests in flight")
        finished_before = set(served.finished)
        os.kill(dead.process.pid, signal.SIGKILL)
        killed_at = time.time()
        dead.process.wait(30)
        marked = _marked(bootstrap, topic, f"{group}-replica0", dead.process)
        _until(server, served, lambda: served.ended == len(streams), 240, "every request")
        assert talker.wait(60) == 0
    finally:
        if talker is not None and talker.poll() is None:
            talker.kill()
        server.close()
    moves = redispatch.moves_of(server.pools[omni.CODE2WAV])
    return {
        "served": served,
        "on_dead": list(dead.added),
        "on_other": list(replicas[1].added),
        "finished_before": finished_before,
        "marked": marked,
        "moved": list(moves.moved) if moves is not None else [],
        "killed_at": killed_at,
    }


def _mid_run(served: Served, on_dead: list[str]) -> bool:
    """Some of the replica's requests ended and most are in flight, some of them mid-stream."""
    ended = [rid for rid in on_dead if rid in served.finished]
    flowing = [rid for rid in on_dead if served.codes[rid] and rid not in served.finished]
    return len(ended) >= 2 and len(flowing) >= 6 and len(on_dead) - len(ended) >= 20


def _until(
    server: omni.OmniServer, served: Served, done: Callable[[], bool], timeout_s: float, what: str
) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            state = {"finished": len(served.finished), "errors": served.errors}
            raise AssertionError(f"timed out waiting for {what}: {state}")
        served.take(server.read(0.2))


def _streams() -> dict[str, list[int]]:
    return edge.unique_streams({f"s{n}": LENGTHS[n % len(LENGTHS)] for n in range(REQUESTS)})


@pytest.mark.timeout(600)
def test_a_dead_replica_s_requests_finish_on_the_other_equal_to_an_undisturbed_run(
    bootstrap: str, new_topic: Callable[[], str], tmp_path: Path
) -> None:
    streams = _streams()
    baseline = edge.run_edge(SHM, streams)[0]  # the undisturbed run
    run = _run(bootstrap, new_topic(), tmp_path, streams)
    served: Served = run["served"]
    in_flight = set(run["on_dead"]) - run["finished_before"]
    assert len(in_flight) >= 20 and len(run["finished_before"] & set(run["on_dead"])) >= 2
    # the window of docs/vllm-omni.md: the dead replica handed a request's end to its engine
    # (and marked it) but its last output never reached the orchestrator; refused, not twice
    window = {
        rid
        for rid, error in served.errors.items()
        if rid in run["marked"] and "ended on this edge before" in error
    }
    assert set(served.errors) == window, served.errors  # failed with the reason, not hung
    assert set(served.finished) | window == set(streams)
    for rid in set(streams) - window:  # every request whole, in order, none twice
        assert served.codes[rid] == [s["prompt_token_ids"] for s in baseline[rid]], rid
    # what moved: the dead replica's unfinished requests, to the other replica; the rest of
    # its requests had ended there (their last outputs reached the orchestrator)
    moved = set(run["moved"])
    assert moved <= in_flight and not moved & run["finished_before"]
    assert moved <= set(run["on_other"])
    for rid in set(run["on_dead"]) - moved:
        assert rid not in run["on_other"] and rid in set(served.finished) | window, rid
    after = [t for rid in moved for t in served.seen_at[rid] if t > run["killed_at"]]
    assert after and min(after) - run["killed_at"] < 120
    report = os.environ.get(REPORT)
    if report:  # bench.bench_redispatch runs this test and prints what it measured
        summary = {
            "in_flight": len(in_flight),
            "moved": len(moved),
            "finished_moved": len(moved & set(served.finished)),
            "window": sorted(window),
            "first_output_s": min(after) - run["killed_at"],
            "all_finished_s": max(served.finished.values()) - run["killed_at"],
        }
        Path(report).write_text(json.dumps(summary))


@pytest.mark.timeout(600)
def test_with_redispatch_off_a_dead_replica_s_requests_fail_as_in_vllm_omni_0_30(
    bootstrap: str, new_topic: Callable[[], str], tmp_path: Path
) -> None:
    streams = _streams()
    run = _run(bootstrap, new_topic(), tmp_path, streams, redispatch=False)
    served: Served = run["served"]
    in_flight = set(run["on_dead"]) - run["finished_before"]
    assert run["moved"] == []
    assert set(served.errors) <= in_flight and len(served.errors) >= 20
    assert set(served.finished) >= set(streams) - set(run["on_dead"])  # the other's finish
