"""A dead Code2Wav replica costs no request, inside the released vllm-omni's own orchestrator
(mode 1): the package's `Orchestrator` and `StagePool`s (devtools/omni_server.py), two Code2Wav
replicas each a process of its own with the real chunk adapter and connector (replica_client.py,
stage_procs.py), the real talker adapter in a third process, a real broker. One replica is
SIGKILLed with its requests in flight, some of them streaming sessions in their second turn (a
later cache epoch); codeclog's plugin (omni.redispatch) moves them to the other, whose receiver
asks from chunk 0; each request finishes at the orchestrator's output with the codes of an
undisturbed run, none twice, none lost. `redispatch: false` keeps
vllm-omni 0.30's behaviour: the dead replica's requests fail.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import shutil
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
# streaming sessions (vllm-omni's /v1/realtime): two turns, the first a fifth of the request's
# ids; each turn a new cache epoch on the edge (pipeline.talk's `turns`)
SESSIONS = tuple(f"s{n}" for n in range(1, REQUESTS, 3) if LENGTHS[n % len(LENGTHS)] >= 60)
WITHHELD = 2  # requests the dying replica ended (and marked) whose finish it never sent
REPORT = "CODECLOG_REDISPATCH_REPORT"  # a file the main test writes its measures to
PATCH = HERE.parents[1] / "deploy" / "upstream" / "vllm-omni-0.30-redispatch.patch"
PATCHED = "CODECLOG_UPSTREAM_PATCHED"  # set: the main test runs on the patched vllm-omni
MAIN = "test_a_dead_replica_s_requests_finish_on_the_other_equal_to_an_undisturbed_run"


class Turns:
    """The sessions' second turns, submitted to the orchestrator (`streaming_update`) once a
    replica ended a session's first segment: while the dying replica lives, or by the replica
    it moved to (a turn dispatched to a replica the orchestrator has not yet found dead fails
    its request, in vllm-omni 0.30 as in any stage's death)."""

    def __init__(self, server: omni.OmniServer) -> None:
        self.server = server
        self.updated: set[str] = set()

    def submit(self, replicas: list[ReplicaClient]) -> None:
        for replica in replicas:
            for rid in list(replica.segment_ends):
                if rid not in self.updated:
                    self.updated.add(rid)
                    self.server.update(rid)


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
    bootstrap: str,
    topic: str,
    tmp_path: Path,
    streams: dict[str, list[int]],
    turns: dict[str, list[int]],
    **extra: Any,
) -> dict[str, Any]:
    """The pipeline with two Code2Wav replicas; replica 0 SIGKILLed mid-run."""
    group = f"code2wav-{uuid.uuid4().hex[:8]}"
    withhold, go = {"a": WITHHELD}, tmp_path / "go"
    spec = _spec(
        tmp_path, bootstrap, topic, streams, group, withhold_ends=withhold, turns=turns, go=str(go)
    )
    # the talker first: a loaded machine's imports (a minute at load 17) must not count against
    # the replicas' wait for a request's chunks, which runs from their first ask
    talker = subprocess.Popen(
        [sys.executable, str(HERE / "stage_procs.py"), "talker", str(spec)], cwd=HERE
    )
    replicas = [ReplicaClient(spec, "a", 0), ReplicaClient(spec, "b", 1)]
    connector = {
        "name": "CodeclogKafkaConnector",
        "extra": {**edge.kafka_extra(bootstrap, topic, group_id=group), **extra},
    }
    server = omni.OmniServer(replicas, connector)
    served = Served(list(streams))
    sessions = Turns(server)
    try:
        for rid in streams:
            server.submit(rid, resumable=rid in turns)
        # the thinker and talker engines' part is done, once the orchestrator gave them each
        # request: it drops an engine's output for a request it has not registered yet, and the
        # request would then wait for its upstream stages' ends forever
        _until_submitted(replicas, streams)
        for rid in streams:
            server.finish_upstream(rid)
        for replica in replicas:
            assert replica.ready.wait(300), f"replica {replica.name} did not start"
        _until_file(tmp_path / "talker.ready", talker, 300)
        go.write_text("1")
        dead = replicas[0]
        mid_run = functools.partial(_mid_run, served, dead, sessions)
        submit_turns = functools.partial(sessions.submit, replicas)
        _until(server, served, mid_run, 120, "requests in flight", submit_turns)
        finished_before = set(served.finished)
        later_turn = {rid for rid in sessions.updated if rid in dead.added} - finished_before
        os.kill(dead.process.pid, signal.SIGKILL)
        killed_at = time.time()
        dead.process.wait(30)
        marked = _marked(bootstrap, topic, f"{group}-replica0", dead.process)
        _until(
            server,
            served,
            lambda: served.ended == len(streams),
            240,
            "every request",
            lambda: sessions.submit(replicas[1:]),
        )
        assert talker.wait(60) == 0
    finally:
        if talker.poll() is None:
            talker.kill()
        server.close()
    return {
        "served": served,
        "on_dead": list(dead.added),
        "withheld": set(dead.withheld),
        "on_other": list(replicas[1].added),
        "finished_before": finished_before,
        "later_turn": later_turn,  # the dead replica's sessions in their second turn
        "marked": marked,
        "moved": sorted(set(replicas[1].added) & set(dead.added)),  # submitted again
        "killed_at": killed_at,
    }


def _until_submitted(
    replicas: list[ReplicaClient], streams: dict[str, list[int]], timeout_s: float = 60
) -> None:
    """Until the orchestrator submitted every request to a Code2Wav replica: it submits a
    request's stages in order (vllm-omni's async-chunk prewarm), so the thinker and the talker
    have it too."""
    deadline = time.monotonic() + timeout_s
    while sum(len(set(replica.added)) for replica in replicas) < len(streams):
        if time.monotonic() > deadline:
            raise AssertionError("the orchestrator did not submit every request")
        time.sleep(0.01)


def _until_file(path: Path, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None, f"the talker exited ({process.returncode})"
        if time.monotonic() > deadline:
            raise AssertionError(f"no {path.name} in {timeout_s} s")
        time.sleep(0.05)


def _mid_run(served: Served, dead: ReplicaClient, sessions: Turns) -> bool:
    """Some of the replica's requests ended and most are in flight, some of them mid-stream,
    some sessions in their second turn; the ends it holds back were reached."""
    added = set(dead.added)
    ended = {rid for rid in added if rid in served.finished}
    flowing = [rid for rid in added if served.codes[rid] and rid not in served.finished]
    later = (sessions.updated & added) - ended
    return (
        len(ended) >= 2
        and len(flowing) >= 6
        and len(added - ended) >= 20
        and len(later) >= 2
        and len(dead.withheld) == WITHHELD
    )


def _until(
    server: omni.OmniServer,
    served: Served,
    done: Callable[[], bool],
    timeout_s: float,
    what: str,
    each: Callable[[], None],
) -> None:
    """Read the orchestrator's output until `done`, calling `each` between reads."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            state = {"finished": len(served.finished), "errors": served.errors}
            raise AssertionError(f"timed out waiting for {what}: {state}")
        served.take(server.read(0.2))
        each()


def _streams() -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """The requests' codec ids, and the sessions' first-turn lengths (pipeline.talk)."""
    streams = edge.unique_streams({f"s{n}": LENGTHS[n % len(LENGTHS)] for n in range(REQUESTS)})
    names = {rid: rid.split("-")[0] for rid in streams}
    turns = {rid: [len(ids) // 3] for rid, ids in streams.items() if names[rid] in SESSIONS}
    return streams, turns


@pytest.mark.timeout(600)
def test_a_dead_replica_s_requests_finish_on_the_other_equal_to_an_undisturbed_run(
    bootstrap: str, new_topic: Callable[[], str], tmp_path: Path
) -> None:
    orchestrator = importlib.import_module("vllm_omni.engine.orchestrator").Orchestrator
    if os.environ.get(PATCHED):  # the upstream patch moves them, not the plugin's wrapper
        assert hasattr(orchestrator, redispatch.PATCHED)
        assert not getattr(orchestrator, redispatch.WRAPPED, False)
    streams, turns = _streams()
    baseline = edge.run_edge(SHM, streams, turns=turns)[0]  # the undisturbed run
    run = _run(bootstrap, new_topic(), tmp_path, streams, turns)
    served: Served = run["served"]
    in_flight = set(run["on_dead"]) - run["finished_before"]
    assert len(in_flight) >= 20 and len(run["finished_before"] & set(run["on_dead"])) >= 2
    assert len(run["later_turn"]) >= 2 and run["later_turn"] <= in_flight
    assert served.errors == {} and set(served.finished) == set(streams)
    for rid in streams:  # every request whole, in order, none twice
        assert served.codes[rid] == [s["prompt_token_ids"] for s in baseline[rid]], rid
    # the dead replica had ended (and marked) these; their finish never reached the
    # orchestrator: moved too, the other replica served them again (the ledger's move)
    withheld = run["withheld"]
    assert len(withheld) == WITHHELD and withheld <= run["marked"] and withheld <= set(run["moved"])
    # what moved: the dead replica's unfinished requests, to the other replica; the rest of
    # its requests had ended there (their last outputs reached the orchestrator)
    moved = set(run["moved"])
    assert moved <= in_flight and not moved & run["finished_before"]
    assert run["later_turn"] <= moved  # sessions in their second turn moved, from chunk 0
    assert moved <= set(run["on_other"])
    for rid in set(run["on_dead"]) - moved:
        assert rid not in run["on_other"] and rid in served.finished, rid
    after = [t for rid in moved for t in served.seen_at[rid] if t > run["killed_at"]]
    assert after and min(after) - run["killed_at"] < 120
    report = os.environ.get(REPORT)
    if report:  # bench.bench_redispatch runs this test and prints what it measured
        summary = {
            "in_flight": len(in_flight),
            "moved": len(moved),
            "finished_moved": len(moved & set(served.finished)),
            "ended_there": len(withheld),
            "later_turn": len(run["later_turn"]),
            "first_output_s": min(after) - run["killed_at"],
            "all_finished_s": max(served.finished.values()) - run["killed_at"],
        }
        Path(report).write_text(json.dumps(summary))


@pytest.mark.timeout(600)
def test_with_redispatch_off_a_dead_replica_s_requests_fail_as_in_vllm_omni_0_30(
    bootstrap: str, new_topic: Callable[[], str], tmp_path: Path
) -> None:
    streams, turns = _streams()
    run = _run(bootstrap, new_topic(), tmp_path, streams, turns, redispatch=False)
    served: Served = run["served"]
    in_flight = set(run["on_dead"]) - run["finished_before"]
    assert run["moved"] == []
    assert set(served.errors) <= in_flight and len(served.errors) >= 20
    assert run["withheld"] <= set(served.errors)
    assert set(served.finished) >= set(streams) - set(run["on_dead"])  # the other's finish


@pytest.mark.timeout(900)
def test_the_upstream_patch_moves_them_without_the_plugin_s_wrapper(
    bootstrap: str, tmp_path: Path
) -> None:
    """deploy/upstream/'s patch applied to the installed vllm-omni 0.30 (a copy of it first on
    the path): the main test passes with the orchestrator's own re-dispatch. Beside a CPU-bound
    process: the cheap form of the SIGKILL stress in CI (docs/testing.md, "Stress")."""
    import vllm_omni

    site = tmp_path / "site"
    shutil.copytree(Path(vllm_omni.__file__).parent, site / "vllm_omni")
    applied = subprocess.run(
        ["patch", "-p1", "-d", str(site), "-i", str(PATCH)], capture_output=True, text=True
    )
    assert applied.returncode == 0, applied.stdout + applied.stderr
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, PATCHED: "1", "CODECLOG_BOOTSTRAP": bootstrap}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        ran = subprocess.run(
            [*command, f"{Path(__file__).name}::{MAIN}"],
            cwd=HERE,
            env=env,
            capture_output=True,
            text=True,
            timeout=840,
        )
    finally:
        burner.kill()
        burner.wait()
    assert ran.returncode == 0, ran.stdout[-4000:]
