"""An independent history checker for exactly-once audio under faults, in Jepsen's terms, using
none of the pipeline's code. Its reads and findings: docs/local-kafka.md, "Network faults"."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from codeclog.devtools.audit import decode, read_records, shipped_schemas
from codeclog.devtools.log_segments import ABORT, LOG_WAIT_S, OPEN, Locator, LogRead, read_log

KINDS = (
    "lost",
    "duplicated",
    "aborted_read",
    "torn",
    "out_of_order",
    "undecodable",
    "incomplete_log",
)
ENDED_EPOCH = ("evicted", "aborted", "vocoder_failed")  # dead letters that end a stream


@dataclasses.dataclass(frozen=True)
class Chunk:
    partition: int
    offset: int
    request: str
    epoch: int
    seq: int
    frames: int  # codec ids it carries (0: a marker or sentinel, nothing to decode)


@dataclasses.dataclass(frozen=True)
class Output:
    """A record of the audio, dead-letter or progress topic, as read_uncommitted saw it."""

    topic: str
    partition: int
    offset: int
    kind: str  # "window", "letter", "checkpoint"
    fields: dict[str, Any]
    committed: bool  # a read_committed reader returned it
    fate: str = ""  # from the log: commit, abort, open; "" unknown (no data dir given)


@dataclasses.dataclass(frozen=True)
class Undecodable:
    """A record the .avsc files cannot decode."""

    topic: str
    partition: int
    offset: int
    kind: str  # "chunk", or the output kind its topic holds ("window", "letter", "checkpoint")
    reason: str  # the decoder's error
    committed: bool  # a read_committed reader returned it

    def describe(self) -> str:
        seen = "" if self.committed else " (aborted: no read_committed reader returns it)"
        return f"{self.topic}[{self.partition}]@{self.offset}: cannot decode ({self.reason}){seen}"


@dataclasses.dataclass
class History:
    chunks: list[Chunk]
    outputs: list[Output]
    committed_offsets: dict[int, int]  # chunk partition -> the group's committed offset
    undecodable: list[Undecodable] = dataclasses.field(default_factory=list)
    logs: list[LogRead] = dataclasses.field(default_factory=list)  # where the fates came from


def describe_logs(logs: Iterable[LogRead]) -> str:
    """One line: which node's log gave each partition's fates, and whether it was complete."""
    logs = list(logs)
    if not logs:
        return "no log read: fates unknown"
    if all(log.complete for log in logs):
        reads = ", ".join(f"{log.topic}[{log.partition}] node {log.node}" for log in logs)
        return f"fates from the leaders' logs, each complete to its high watermark: {reads}"
    return "; ".join(log.describe() for log in logs)


Anomalies = dict[str, list[str]]


def check(history: History) -> Anomalies:
    """Every anomaly of the history, by kind (each kind present, possibly empty)."""
    found: Anomalies = {kind: [] for kind in KINDS}
    committed = [o for o in history.outputs if o.committed]
    windows = [o for o in committed if o.kind == "window"]
    found["duplicated"] += _duplicated(windows)
    found["lost"] += _lost(history, windows, [o for o in committed if o.kind == "letter"])
    found["aborted_read"] += [
        f"{o.topic}[{o.partition}]@{o.offset}: read committed, its transaction {o.fate}"
        for o in committed
        if o.fate in (ABORT, OPEN)
    ]
    found["torn"] += _torn(windows, [o for o in committed if o.kind == "checkpoint"])
    found["out_of_order"] += _out_of_order(windows)
    found["undecodable"] += _undecodable(history, [o for o in committed if o.kind == "letter"])
    found["incomplete_log"] += [log.describe() for log in history.logs if not log.complete]
    return found


def _undecodable(history: History, letters: list[Output]) -> list[str]:
    """Every undecodable output record, and every undecodable chunk that no committed dead
    letter accounts for (one that does is the pipeline's refusal of it, as it should be)."""
    refused = _refused(letters)
    found = []
    for u in history.undecodable:
        if u.kind == "chunk":
            if (u.partition, u.offset) in refused:
                continue
            found.append(f"{u.describe()}, and no dead letter accounts for it")
        else:
            found.append(u.describe())
    return found


def _stream(o: Output) -> tuple[str, int]:
    return (str(o.fields["request_id"]), int(o.fields["cache_epoch"]))


def _duplicated(windows: list[Output]) -> list[str]:
    keys = Counter((*_stream(o), int(o.fields["window_index"])) for o in windows)
    chunks = Counter(
        (*_stream(o), int(seq)) for o in windows for seq in o.fields.get("chunk_seqs", [])
    )
    return [f"window {k} committed {n} times" for k, n in sorted(keys.items()) if n > 1] + [
        f"chunk {k} in {n} committed windows" for k, n in sorted(chunks.items()) if n > 1
    ]


def _refused(letters: list[Output]) -> set[tuple[int, int]]:
    """(partition, offset) of every chunk a committed dead letter refused."""
    return {(int(o.fields["source_partition"]), int(o.fields["source_offset"])) for o in letters}


def _lost(history: History, windows: list[Output], letters: list[Output]) -> list[str]:
    decoded = {(*_stream(o), int(s)) for o in windows for s in o.fields.get("chunk_seqs", [])}
    refused = _refused(letters)
    ended = {
        (str(o.fields.get("request_id") or ""), int(o.fields.get("cache_epoch") or 0))
        for o in letters
        if o.fields.get("reason") in ENDED_EPOCH
    }
    lost = []
    for c in history.chunks:
        if c.offset >= history.committed_offsets.get(c.partition, 0) or not c.frames:
            continue
        if (c.request, c.epoch, c.seq) in decoded or (c.partition, c.offset) in refused:
            continue
        if (c.request, c.epoch) not in ended:
            lost.append(f"chunk {c.request} epoch {c.epoch} seq {c.seq} (@{c.offset})")
    return sorted(set(lost))


def _torn(windows: list[Output], checkpoints: list[Output]) -> list[str]:
    latest: dict[str, Output] = {}
    for o in sorted(checkpoints, key=lambda o: (o.partition, o.offset)):
        latest[str(o.fields["request_id"])] = o
    indices: dict[tuple[str, int], set[int]] = defaultdict(set)
    for o in windows:
        indices[_stream(o)].add(int(o.fields["window_index"]))
    torn = []
    for rid, o in sorted(latest.items()):
        if not o.fields.get("open"):
            continue  # a closed stream's checkpoint no longer counts its windows
        emitted = int(o.fields["windows_emitted"])
        have = indices.get((rid, int(o.fields["cache_epoch"])), set())
        if have != set(range(emitted)):
            torn.append(f"{rid}: checkpoint says {emitted} windows, committed {sorted(have)}")
    return torn


def _out_of_order(windows: list[Output]) -> list[str]:
    """Each stream's windows (first committed copy of each index: duplicates are their own
    kind) in log order must go up by index, each starting where the one before it ended (a
    missing window is lost or torn, not out of order)."""
    by_stream: dict[tuple[str, int], dict[int, Output]] = defaultdict(dict)
    for o in sorted(windows, key=lambda o: (o.partition, o.offset)):
        by_stream[_stream(o)].setdefault(int(o.fields["window_index"]), o)
    bad = []
    for stream, by_index in sorted(by_stream.items()):
        in_log = sorted(by_index.values(), key=lambda o: (o.partition, o.offset))
        indices = [int(o.fields["window_index"]) for o in in_log]
        if indices != sorted(indices):
            bad.append(f"{stream}: windows in log order {indices}")
            continue
        for index, o in by_index.items():
            before = by_index.get(index - 1)
            if before is None:
                continue
            end = int(before.fields["sample_offset"]) + len(before.fields["pcm_s16le"]) // 2
            if int(o.fields["sample_offset"]) != end:
                bad.append(
                    f"{stream}: window {index} starts at {o.fields['sample_offset']}, "
                    f"window {index - 1} ended at {end}"
                )
    return bad


# ----------------------------------------------------------------------------- reading


@dataclasses.dataclass(frozen=True)
class Topics:
    chunks: str
    audio: str
    dlq: str
    progress: str


Records = list[tuple[int, int, bytes]]  # (partition, offset, value)


def read_history(
    client: dict[str, str],
    topics: Topics,
    group: str,
    log_dirs: Mapping[int, Path] | None = None,
    wait_s: float = LOG_WAIT_S,
) -> History:
    """The history of one run; with the nodes' log dirs (node id -> <cluster>/node-N/kafka),
    the fate of every transactional batch of the output topics, from each partition's leader's
    log once it holds the high watermark (read after the records, so every marker a
    read_committed reader relied on lies below it)."""
    schemas = shipped_schemas()
    chunks, undecodable = decode_chunks(
        topics.chunks, read_records(client, topics.chunks, "read_committed"), schemas
    )
    kinds = ((topics.audio, "window"), (topics.dlq, "letter"), (topics.progress, "checkpoint"))
    read = {
        topic: (
            read_records(client, topic, "read_uncommitted"),
            {(p, off) for p, off, _ in read_records(client, topic, "read_committed")},
        )
        for topic, _kind in kinds
    }
    logs: list[LogRead] = []
    fates_by: dict[tuple[str, int], dict[int, str]] = {}
    if log_dirs is not None:
        with Locator(client) as locate:
            for topic, _kind in kinds:
                for partition in sorted({p for p, _, _ in read[topic][0]}):
                    log, found = read_log(log_dirs, topic, partition, locate, wait_s)
                    logs.append(log)
                    fates_by[(topic, partition)] = found
    outputs: list[Output] = []
    for topic, kind in kinds:
        found_outputs, bad = decode_outputs(topic, kind, *read[topic], schemas, fates_by)
        outputs += found_outputs
        undecodable += bad
    committed_offsets = _committed_offsets(client, topics.chunks, group)
    return History(chunks, outputs, committed_offsets, undecodable, logs)


def decode_chunks(
    topic: str, records: Records, schemas: Any
) -> tuple[list[Chunk], list[Undecodable]]:
    """The codec chunks of the chunk topic's records (read_committed), and what would not
    decode."""
    chunks, bad = [], []
    for p, off, value in records:
        decoded = _decode(value, schemas)
        if isinstance(decoded, str):
            bad.append(Undecodable(topic, p, off, "chunk", decoded, True))
        elif decoded[0].startswith("codec_chunk"):
            f = decoded[1]
            chunks.append(
                Chunk(p, off, f["request_id"], f["cache_epoch"], f["chunk_seq"], _frames(f))
            )
    return chunks, bad


def decode_outputs(
    topic: str,
    kind: str,
    uncommitted: Records,
    committed: set[tuple[int, int]],
    schemas: Any,
    fates_by: Mapping[tuple[str, int], Mapping[int, str]],
) -> tuple[list[Output], list[Undecodable]]:
    """The records of an output topic as read_uncommitted returned them, each marked with
    whether read_committed returned it too and its fate from the log ("" unknown)."""
    outputs, bad = [], []
    for p, off, value in uncommitted:
        decoded = _decode(value, schemas)
        if isinstance(decoded, str):
            bad.append(Undecodable(topic, p, off, kind, decoded, (p, off) in committed))
            continue
        fate = fates_by.get((topic, p), {}).get(off, "")
        outputs.append(Output(topic, p, off, kind, decoded[1], (p, off) in committed, fate))
    return outputs, bad


def _frames(fields: dict[str, Any]) -> int:
    numel = fields.get("code_flat_numel")
    return len(fields.get("codes") or ()) if numel is None else int(numel)


def _decode(value: bytes, schemas: Any) -> tuple[str, dict[str, Any]] | str:
    """(record type, fields), or why the value cannot be decoded: a truncated value makes
    fastavro raise EOFError, a damaged one anything from ValueError to UnicodeDecodeError."""
    try:
        return decode(value, schemas)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:200]


def _committed_offsets(client: dict[str, str], topic: str, group: str) -> dict[int, int]:
    consumer = Consumer({**client, "group.id": group, "enable.auto.commit": False, "log_level": 2})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        tps = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=30)
        return {tp.partition: max(tp.offset, 0) for tp in tps}
    finally:
        consumer.close()
