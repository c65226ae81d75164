"""Kill the vllm-omni connector's receiver under load and replace it: what its requests lose.

    python -m bench.bench_receiver_takeover                  # 32 requests, a local broker
    python -m bench.bench_receiver_takeover --requests 64 --kill-at 0.5 --bootstrap HOST:PORT

A talker process puts the MiniCPM-o codec chunks of N requests (1 to 8 chunks each, upstream
windowing) through `CodecTalkerConnector`'s put keys, one chunk per request per round, paced.
A receiver process polls each request's chunks in order as vllm-omni's chunk adapter does
(`get` of `{request}_1_{n}`, n from 0) and logs every payload as it is handed out. Once it has
handed out `--kill-at` of all chunks, it is SIGKILLed and a new receiver process starts under
the same replica identity (consumer group, static member) and is given every request, as a
re-submission would. It prints one line: the requests in flight at the kill (started, not
ended at the dead receiver), how many of them the new one finished (handed out whole, from
chunk 0), how many were lost, how many of the requests that had ended were handed out again,
and the time from the kill to the first chunk the new process handed out (its start, its
takeover of the group, its read of the ledger and of the requests it re-reads). No timed test
asserts any of it (BENCHMARKS.md has the runs).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.local_broker import cluster

CHECKOUT = Path(__file__).resolve().parents[1]
STAGE = 1  # the talker; the receiver is stage 2
LENGTHS = (1, 2, 3, 4, 5, 6, 7, 8)  # chunks per request (the last one ends it)


def _replace(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def _payloads(requests: list[str]) -> dict[str, list[Any]]:
    """Each request's payloads, from the upstream-exact windowing (25 new ids a window)."""
    from codeclog.omni.minicpmo import minicpmo_payload
    from codeclog.producers.talker import Talker
    from codeclog.schemas.records import CodecChunk

    class Sink:
        def __init__(self) -> None:
            self.records: list[Any] = []

        def publish(self, record: Any) -> None:
            self.records.append(record)

    sink = Sink()
    talker = Talker(sink, producer_id="bench-talker")
    out = {}
    for n, rid in enumerate(requests):
        for step in range(LENGTHS[n % len(LENGTHS)] - 1):
            talker.step(rid, [(n * 31 + step * 25 + i) % 6000 for i in range(25)])
        talker.step(rid, [], segment_finished=True, finished=True)
        chunks = [r for r in sink.records if isinstance(r, CodecChunk)]
        out[rid] = [minicpmo_payload(c, finished=c.last_chunk) for c in chunks]
        sink.records.clear()
    return out


def run_talker(spec: dict[str, Any]) -> None:
    from codeclog.omni.connector import CodeclogKafkaConnector

    connector = CodeclogKafkaConnector(
        {
            "bootstrap": spec["bootstrap"],
            "topic": spec["topic"],
            "stage_id": STAGE,
            "role": "sender",
        }
    )
    payloads = _payloads(spec["requests"])
    for index in range(max(len(p) for p in payloads.values())):
        for rid, items in payloads.items():
            if index < len(items):
                key = f"{rid}_{STAGE}_{index}"
                if not connector.put(str(STAGE), str(STAGE + 1), key, items[index])[0]:
                    raise SystemExit(f"put {key} failed: {connector.health()['last_error']}")
        time.sleep(spec["pace_s"])
    connector.close()
    _replace(Path(spec["out"]) / "talker.done", "1")


def run_receiver(spec: dict[str, Any], name: str) -> None:
    from codeclog.omni.connector import CodeclogKafkaConnector
    from codeclog.omni.failures import ERROR_KEY

    connector = CodeclogKafkaConnector(
        {
            "bootstrap": spec["bootstrap"],
            "topic": spec["topic"],
            "stage_id": STAGE + 1,
            "role": "receiver",
            "group_id": spec["group"],
        }
    )
    next_chunk = dict.fromkeys(spec["requests"], 0)
    with open(Path(spec["out"]) / f"handed-{name}.jsonl", "a", buffering=1) as log:
        while next_chunk:
            for rid, chunk in list(next_chunk.items()):
                got = connector.get(str(STAGE), str(STAGE + 1), f"{rid}_{STAGE}_{chunk}")
                if got is None:
                    continue
                meta = got[0].get("meta", {})
                finished = bool(meta.get("finished"))
                error = meta.get(ERROR_KEY)
                line = {"rid": rid, "chunk": chunk, "finished": finished, "error": error}
                log.write(json.dumps({**line, "at": time.time()}) + "\n")
                next_chunk[rid] += 1
                if finished:
                    del next_chunk[rid]
            time.sleep(0.002)
    connector.close()
    _replace(Path(spec["out"]) / f"{name}.done", "1")


def _spawn(spec_path: Path, role: str, *more: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "bench.bench_receiver_takeover", "--role", role]
    return subprocess.Popen([*command, "--spec", str(spec_path), *more], cwd=CHECKOUT)


def _handed(out: Path, name: str) -> list[dict[str, Any]]:
    path = out / f"handed-{name}.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


def _wait_for(path: Path, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{path.name}: the process ended or timed out first")
        time.sleep(0.05)


def _marked_by(bootstrap: str, topic: str, producer: str) -> set[str]:
    """The requests the process `producer` marked as ended on the ledger."""
    from codeclog.kafka.reader import read_partition
    from codeclog.omni.ledger import ledger_topic
    from codeclog.schemas import wire
    from codeclog.schemas.records import HandOutMark

    marks = set()
    for record in read_partition({"bootstrap.servers": bootstrap}, ledger_topic(topic), 0, 0, None):
        mark = wire.decode(record.value)
        if isinstance(mark, HandOutMark) and mark.producer_id == producer:
            marks.add(mark.request_id)
    return marks


def measure(bootstrap: str, requests: int, kill_at: float, pace_s: float) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic

    run = uuid.uuid4().hex[:8]
    topic = f"takeover-{run}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 8, 1)])[topic].result(30)
    names = [f"r{n:03d}-{run}" for n in range(requests)]
    total = sum(LENGTHS[n % len(LENGTHS)] for n in range(requests))
    with tempfile.TemporaryDirectory(prefix="codeclog-takeover-") as tmp:
        out = Path(tmp)
        spec: dict[str, Any] = {"bootstrap": bootstrap, "topic": topic, "out": tmp}
        spec |= {"group": f"code2wav-{run}", "requests": names, "pace_s": pace_s}
        spec_path = out / "spec.json"
        spec_path.write_text(json.dumps(spec))
        first = _spawn(spec_path, "receiver", "--name", "a")
        talker = _spawn(spec_path, "talker")
        try:
            while len(_handed(out, "a")) < kill_at * total:
                if first.poll() is not None or talker.poll() not in (None, 0):
                    raise SystemExit("a process ended before the kill")
                time.sleep(0.01)
            os.kill(first.pid, signal.SIGKILL)
            killed_at = time.time()
            first.wait(30)
            second = _spawn(spec_path, "receiver", "--name", "b")
            _wait_for(out / "b.done", second, 600)
            _wait_for(out / "talker.done", talker, 600)
        finally:
            for process in (first, talker):
                if process.poll() is None:
                    process.kill()
        before, after = _handed(out, "a"), _handed(out, "b")
        marked = _marked_by(bootstrap, topic, f"omni-{first.pid}")
    return _verdict(names, before, after, marked, killed_at)


def _verdict(
    names: list[str],
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
    marked: set[str],
    killed_at: float,
) -> dict[str, Any]:
    ended_before = {item["rid"] for item in before if item["finished"]}
    in_flight = [rid for rid in names if rid not in marked]  # not ended, as the ledger says
    started = {item["rid"] for item in before}
    finished_after = [rid for rid in in_flight if _whole(rid, after)]
    handed_again = sorted({i["rid"] for i in after if i["rid"] in marked and not i["error"]})
    return {
        "requests": len(names),
        "in_flight": len([rid for rid in in_flight if rid in started]),
        "not_started": len([rid for rid in in_flight if rid not in started]),
        "finished_after": len(finished_after),
        "lost": len(in_flight) - len(finished_after),
        "handed_twice": len(handed_again),
        "ended_unmarked": len(ended_before - marked),  # a terminal out, its mark in flight
        "refused": len({i["rid"] for i in after if i["error"]}),
        "first_chunk_s": min(i["at"] for i in after) - killed_at if after else float("nan"),
    }


def _whole(request: str, handed: list[dict[str, Any]]) -> bool:
    """Whether `request` was handed out from chunk 0 to its terminal, in order, once each."""
    chunks = [i for i in handed if i["rid"] == request and not i["error"]]
    in_order = [i["chunk"] for i in chunks] == list(range(len(chunks)))
    return in_order and bool(chunks) and chunks[-1]["finished"]


def line(result: dict[str, Any]) -> str:
    return (
        f"receiver killed with {result['in_flight']} requests in flight "
        f"(+{result['not_started']} not started): {result['finished_after']} finished, "
        f"{result['lost']} lost, {result['handed_twice']} handed out twice after restart "
        f"({result['refused']} that had ended refused, {result['ended_unmarked']} ended with "
        f"the mark in flight); first chunk {result['first_chunk_s']:.1f} s after the kill"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=32, help="requests (default 32)")
    parser.add_argument(
        "--kill-at", type=float, default=0.4, help="kill once this share of chunks is handed out"
    )
    parser.add_argument("--pace-s", type=float, default=0.25, help="between talker rounds")
    parser.add_argument("--runs", type=int, default=3, help="kills, one after the other")
    parser.add_argument("--bootstrap", help="a running cluster (default: a local broker)")
    parser.add_argument("--json", action="store_true", help="one JSON object per run too")
    parser.add_argument("--role", choices=("talker", "receiver"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role:
        logging.getLogger("codeclog").addHandler(logging.NullHandler())  # the line says it all
        spec = json.loads(Path(args.spec).read_text())
        run_talker(spec) if args.role == "talker" else run_receiver(spec, args.name)
        return 0
    if args.requests < 1 or not 0 < args.kill_at < 1:
        parser.error("--requests must be >= 1 and --kill-at between 0 and 1")
    with cluster(args.bootstrap) as bootstrap:
        for _ in range(args.runs):
            result = measure(bootstrap, args.requests, args.kill_at, args.pace_s)
            print(line(result), flush=True)
            if args.json:
                print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
