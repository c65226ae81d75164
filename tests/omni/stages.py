"""Two vllm-omni stages in two processes, talking through CodeclogKafkaConnector.

`python -m tests.omni.stages sender BOOTSTRAP TOPIC OUT_DIR` puts every chunk of `chunks()` with
the put keys of vllm-omni's chunk adapter (requests interleaved), writing `sent.progress` as it
goes; `... receiver BOOTSTRAP TOPIC OUT_DIR` polls each request's chunks 0, 1, 2, ... in order
(as the adapter's receive loop does) and writes `received.json`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from codeclog.omni.connector import CodeclogKafkaConnector
from codeclog.omni.minicpmo import minicpmo_payload
from codeclog.producers.talker import Talker
from codeclog.schemas.records import CodecChunk

REQUESTS = 50
CHUNKS_PER_REQUEST = 20  # 19 windows of 25 new ids + the exact-boundary final
STAGE = 1  # the talker; Code2Wav is stage 2


class _Sink:
    def __init__(self) -> None:
        self.records: list[object] = []

    def publish(self, record: object) -> None:
        self.records.append(record)


def chunks() -> dict[str, list[CodecChunk]]:
    """Each request's chunks, from the upstream-exact windowing (clock fixed for replays)."""
    sink = _Sink()
    talker = Talker(sink, producer_id="stage1", clock_ms=lambda: 1_767_225_600_000)
    out: dict[str, list[CodecChunk]] = {}
    for r in range(REQUESTS):
        rid = f"req-{r:02d}_x"  # an underscore in the id: put keys split from the right
        for step in range(CHUNKS_PER_REQUEST - 1):
            talker.step(rid, [(r * 31 + step * 25 + i) % 6000 for i in range(25)])
        talker.step(rid, [], segment_finished=True, finished=True)
        out[rid] = [rec for rec in sink.records if isinstance(rec, CodecChunk)]
        sink.records.clear()
    return out


def _write_progress(out: Path, sent: int) -> None:
    """Replaces `sent.progress` whole: the test polls it, and a file truncated then written
    reads empty in between (CI read 0 with 420 chunks sent)."""
    partial = out / "sent.progress.partial"
    partial.write_text(str(sent))
    partial.replace(out / "sent.progress")


def _sender(bootstrap: str, topic: str, out: Path) -> None:
    connector = CodeclogKafkaConnector(
        {
            "bootstrap": bootstrap,
            "topic": topic,
            "stage_id": STAGE,
            "role": "sender",
            "delivery_timeout_ms": 180_000,
        }
    )
    by_request = chunks()
    sent = 0
    for index in range(CHUNKS_PER_REQUEST):
        for rid, items in by_request.items():
            payload = minicpmo_payload(items[index], finished=items[index].last_chunk)
            ok, _size, _meta = connector.put(
                str(STAGE), str(STAGE + 1), f"{rid}_{STAGE}_{index}", payload
            )
            if not ok:
                raise SystemExit(f"put {rid} {index} failed: {connector.health()['last_error']}")
            sent += 1
            _write_progress(out, sent)
    connector.close()
    (out / "sent.done").write_text(json.dumps(connector.health()))


def _receiver(bootstrap: str, topic: str, out: Path) -> None:
    connector = CodeclogKafkaConnector(
        {
            "bootstrap": bootstrap,
            "topic": topic,
            "stage_id": STAGE + 1,
            "role": "receiver",
            "group_id": f"{topic}-receiver",
            # the restart is under test, not the wait bound: a loaded machine restarts the
            # broker in over a minute (the default bound), and the request would end there
            "request_wait_s": 240,
        }
    )
    received: dict[str, list[dict[str, object]]] = {}
    deadline = time.monotonic() + 240.0
    for rid in chunks():
        received[rid] = []
        for index in range(CHUNKS_PER_REQUEST):
            key = f"{rid}_{STAGE}_{index}"
            got = connector.get_with_deadline(str(STAGE), str(STAGE + 1), key, deadline=deadline)
            if got is None:
                raise SystemExit(f"no chunk {key} by the deadline: {connector.health()}")
            payload, _size = got
            meta = payload["meta"]
            received[rid].append(
                {
                    "chunk_seq": meta["chunk_seq"],
                    "cache_epoch": meta["cache_epoch"],
                    "codes": payload["codes"]["audio"].tolist(),
                    "finished": bool(meta["finished"]),
                }
            )
        connector.cleanup(rid)
    health = connector.health()
    connector.close()
    (out / "received.json").write_text(json.dumps({"received": received, "health": health}))


if __name__ == "__main__":
    role, bootstrap, topic, folder = sys.argv[1:5]
    (_sender if role == "sender" else _receiver)(bootstrap, topic, Path(folder))
