"""The talker and a Code2Wav replica of the MiniCPM-o edge, each a process of its own, as in a
vllm-omni deployment (one engine process per stage replica), for the tests that kill one.

`python stage_procs.py talker SPEC` runs the real talker adapter over the spec's streams, one
codec id per request per step, `pace_s` apart, writing `talker.progress` (steps done); where
the spec names a `go` file, it writes `talker.ready` once its adapter is built and waits for
that file before its first step.
`python stage_procs.py code2wav SPEC NAME REPLICA` runs the Code2Wav stage's scheduler loop as
the adapter sees it (pipeline.Code2Wav) on replica REPLICA for the spec's requests (or those in
`requests-NAME.json` once that file exists: what vllm-omni would submit to this process), and
logs every payload the connector hands to the adapter, as it hands it out, to
`handed-NAME.jsonl` (one line per payload, written before the adapter sees it: what a SIGKILL
can leave behind). Requests submitted later (another replica's, re-routed to this one) are in
`more-NAME.json` when it appears. When every request ended and no more are coming (`more` is
false in the spec, or the file was read), it writes `NAME.done`.

`python stage_procs.py replica SPEC NAME REPLICA FD` is a Code2Wav replica behind vllm-omni's
orchestrator (replica_client.py is its stage client there): it adds the requests named on its
standard input (`add RID`, `abort RID`), and writes to file descriptor FD one JSON line per
Code2Wav step of a request, once its receiver took its group over (first `{"ready": true}`)
(`{"rid", "seen"}`: what the step got), one when a segment of a resumable request ends
(`{"rid", "segment_end"}`), and one when a request ends
(`{"rid", "end": "finished" | "failed", "reason"}`), each written as it happens; the first
`withhold_ends[NAME]` finishes are held back (`{"rid", "withheld"}`: ended at the adapter, the
finish lagging in the engine's output when the process dies).

SPEC is a JSON file: bootstrap, topic, out (a folder), streams ({request id: codec ids}),
turns ({request id: segment lengths}: resumable requests, pipeline.talk), pace_s, extra (more
connector config), withhold_ends ({replica name: count}), go (a file).
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pipeline as edge
import torch


def _replace(path: Path, text: str) -> None:
    """Write a file others poll whole (a file truncated then written reads empty between)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def _deploy(spec: dict[str, Any]) -> dict[str, Any]:
    extra = edge.kafka_extra(spec["bootstrap"], spec["topic"], **spec.get("extra", {}))
    return edge.deploy_config("CodeclogKafkaConnector", extra)


def talker(spec: dict[str, Any]) -> None:
    out = Path(spec["out"])
    adapter = edge.talker_adapter(_deploy(spec))
    if spec.get("go"):  # started early: its imports never count against a request's wait
        _replace(out / "talker.ready", "1")
        while not Path(spec["go"]).exists():
            time.sleep(0.01)
    progress = out / "talker.progress"
    edge.talk(
        adapter,
        spec["streams"],
        turns=spec.get("turns"),
        pace_s=spec["pace_s"],
        on_step=lambda steps: _replace(progress, str(steps)),
    )
    edge.wait_sent(adapter)
    adapter.shutdown()
    _replace(out / "talker.done", "1")


def _logged(connector: Any, log: Any) -> Any:
    """The connector's get, logging each payload it hands out before returning it."""
    get = connector.get

    def logged_get(*args: Any, **kwargs: Any) -> Any:
        found = get(*args, **kwargs)
        if found is not None:
            payload = found[0]
            meta = payload.get("meta", {}) if isinstance(payload, dict) else {}
            codes = (payload.get("codes") or {}).get("audio") if isinstance(payload, dict) else None
            finished = meta.get("finished")
            log.write(
                json.dumps(
                    {
                        "key": args[2],
                        "codes": codes.tolist() if isinstance(codes, torch.Tensor) else codes,
                        "finished": bool(
                            finished.item() if isinstance(finished, torch.Tensor) else finished
                        ),
                        "error": meta.get("codeclog_error"),
                        "at": time.time(),
                    }
                )
                + "\n"
            )
            log.flush()
        return found

    return logged_get


def code2wav(spec: dict[str, Any], name: str, replica: int) -> None:
    out = Path(spec["out"])
    submitted = out / f"requests-{name}.json"
    requests = json.loads(submitted.read_text()) if submitted.exists() else list(spec["streams"])
    more = out / f"more-{name}.json"
    waits_for_more = bool(spec.get("more"))
    stage = edge.Code2Wav(edge.code2wav_adapter(_deploy(spec), replica=replica))
    deadline = time.monotonic() + float(spec.get("timeout_s", 240))
    with open(out / f"handed-{name}.jsonl", "a", buffering=1) as log:
        stage.adapter.connector.get = _logged(stage.adapter.connector, log)
        for rid in requests:
            stage.add(rid)
        while stage.requests or waits_for_more:
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: requests still waiting: {sorted(stage.requests)}")
            if waits_for_more and more.exists():
                for rid in json.loads(more.read_text()):
                    stage.add(rid)
                waits_for_more = False
            stage.step()
            time.sleep(0.002)
        health = stage.adapter.connector.health()
    stage.adapter.shutdown()
    done = {
        "chunks": stage.chunks,
        "finished": stage.finished,
        "failed": stage.failed,
        "health": {k: v for k, v in health.items() if _plain(v)},
    }
    _replace(out / f"{name}.done", json.dumps(done))


def replica(spec: dict[str, Any], name: str, replica_id: int, fd: int) -> None:
    stage = edge.Code2Wav(edge.code2wav_adapter(_deploy(spec), replica=replica_id))
    commands: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_commands, args=(commands,), daemon=True).start()
    written: dict[str, int] = {}
    segments: dict[str, int] = {}  # segment ends written, per request
    ended: set[str] = set()
    withhold = int(spec.get("withhold_ends", {}).get(name, 0))
    with os.fdopen(fd, "w", buffering=1) as out:
        _until_taken_over(stage.adapter.connector)
        out.write(json.dumps({"ready": True}) + "\n")
        while True:
            while not commands.empty():
                verb, rid = commands.get().split(" ", 1)
                if verb == "quit":
                    stage.adapter.shutdown()
                    return
                if verb == "add":  # again for a session's next turn: Code2Wav.add keeps it
                    stage.add(rid)
            stage.step()
            for rid, seen in stage.chunks.items():
                for item in seen[written.get(rid, 0) :]:
                    out.write(json.dumps({"rid": rid, "seen": item}) + "\n")
                written[rid] = len(seen)
                for segment in range(segments.get(rid, 0), stage.segment_ends[rid]):
                    out.write(json.dumps({"rid": rid, "segment_end": segment}) + "\n")
                segments[rid] = stage.segment_ends[rid]
            ends = [(rid, "finished") for rid in stage.finished]
            ends += [(rid, "failed") for rid in stage.failed]
            for rid, how in ends:
                if rid in ended:
                    continue
                ended.add(rid)
                if how == "finished" and withhold > 0:  # its end lags in the pipe: never sent
                    withhold -= 1
                    out.write(json.dumps({"rid": rid, "withheld": how}) + "\n")
                    continue
                failures = stage.adapter.connector.health().get("failed_requests", {})
                out.write(json.dumps({"rid": rid, "end": how, "reason": failures.get(rid)}) + "\n")
            time.sleep(0.002)


def _until_taken_over(connector: Any, timeout_s: float = 120.0) -> None:
    """Until the connector's receiver took its group over (it serves from then)."""
    deadline = time.monotonic() + timeout_s
    while connector.health().get("recovering", True):
        if time.monotonic() > deadline:
            raise SystemExit("the receiver did not take its group over")
        time.sleep(0.05)


def _read_commands(commands: queue.Queue[str]) -> None:
    for line in sys.stdin:
        commands.put(line.strip())
    commands.put("quit x")


def _plain(value: Any) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


if __name__ == "__main__":
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # as every vLLM engine process does: codeclog's plugin registers
    role, spec_path = sys.argv[1], Path(sys.argv[2])
    loaded = json.loads(spec_path.read_text())
    if role == "talker":
        talker(loaded)
    elif role == "replica":
        replica(loaded, sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        code2wav(loaded, sys.argv[3], int(sys.argv[4]))
