"""An independent history checker for exactly-once audio under faults, in Jepsen's terms.

Like codeclog.devtools.audit it uses none of the pipeline's code: the .avsc files, confluent-kafka
and fastavro (through the audit's decoder), and Kafka's record-batch format v2 read straight from
a local cluster's log segments. It reads the chunk topic, the audio and dead-letter topics both
read_committed and read_uncommitted, the group's committed offsets, and, given a node's data dir,
every transactional batch's fate (the COMMIT or ABORT marker that ended it). It reports:

- lost: a chunk with codec ids below the group's committed offset that no committed window lists
  among its chunk_seqs and no committed dead letter accounts for (its own, or one that ended its
  epoch: evicted, aborted, vocoder_failed). The model is the fold contract's invariant for clean
  input: every frame accepted is decoded exactly once;
- duplicated: a window (request, epoch, index) committed twice, or a chunk listed by two
  committed windows;
- aborted_read: a record a read_committed reader returns whose batch the log says was aborted
  (or is still open);
- torn: part of a step committed without the rest: a request's latest committed checkpoint says
  its open stream emitted n windows, but the committed windows of that epoch are not 0..n-1
  (audio without its checkpoint, or a checkpoint without its audio);
- out_of_order: a stream's committed windows whose log order, or sample offsets, disagree with
  their window indices.

`check(history)` is a pure function of a History (unit-tested on hand-made ones);
`read_history` fills one from a cluster.
"""

from __future__ import annotations

import dataclasses
import struct
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from codeclog.devtools.audit import decode, read_records, shipped_schemas

KINDS = ("lost", "duplicated", "aborted_read", "torn", "out_of_order")
ENDED_EPOCH = ("evicted", "aborted", "vocoder_failed")  # dead letters that end a stream
COMMIT, ABORT, OPEN = "commit", "abort", "open"


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


@dataclasses.dataclass
class History:
    chunks: list[Chunk]
    outputs: list[Output]
    committed_offsets: dict[int, int]  # chunk partition -> the group's committed offset


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


def _lost(history: History, windows: list[Output], letters: list[Output]) -> list[str]:
    decoded = {(*_stream(o), int(s)) for o in windows for s in o.fields.get("chunk_seqs", [])}
    refused = {(int(o.fields["source_partition"]), int(o.fields["source_offset"])) for o in letters}
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


def read_history(
    client: dict[str, str], topics: Topics, group: str, node_dir: Path | None = None
) -> History:
    """The history of one run; with a node's data dir (<cluster>/node-N/kafka), the fate of
    every transactional batch of the output topics (replicas hold the same log)."""
    schemas = shipped_schemas()
    chunks = [
        Chunk(p, off, f["request_id"], f["cache_epoch"], f["chunk_seq"], _frames(f))
        for p, off, name, f in _decoded(client, topics.chunks, "read_committed", schemas)
        if name.startswith("codec_chunk")
    ]
    fates = _fates(node_dir, (topics.audio, topics.dlq, topics.progress)) if node_dir else {}
    outputs = []
    for topic, kind in (
        (topics.audio, "window"),
        (topics.dlq, "letter"),
        (topics.progress, "checkpoint"),
    ):
        committed = {
            (p, off) for p, off, _, _ in _decoded(client, topic, "read_committed", schemas)
        }
        for p, off, _, fields in _decoded(client, topic, "read_uncommitted", schemas):
            fate = fates.get((topic, p), {}).get(off, "") if node_dir else ""
            outputs.append(Output(topic, p, off, kind, fields, (p, off) in committed, fate))
    return History(chunks, outputs, _committed_offsets(client, topics.chunks, group))


def _frames(fields: dict[str, Any]) -> int:
    numel = fields.get("code_flat_numel")
    return len(fields.get("codes") or ()) if numel is None else int(numel)


def _decoded(
    client: dict[str, str], topic: str, isolation: str, schemas: Any
) -> Iterator[tuple[int, int, str, dict[str, Any]]]:
    for partition, offset, value in read_records(client, topic, isolation):
        try:
            name, fields = decode(value, schemas)
        except ValueError:
            continue
        yield partition, offset, name, fields


def _committed_offsets(client: dict[str, str], topic: str, group: str) -> dict[int, int]:
    consumer = Consumer({**client, "group.id": group, "enable.auto.commit": False, "log_level": 2})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        tps = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=30)
        return {tp.partition: max(tp.offset, 0) for tp in tps}
    finally:
        consumer.close()


# ----------------------------------------------------------------------------- log segments

_BATCH_HEADER = struct.Struct(">qiiBIhiqqqhii")  # record batch v2, up to the record count
_TRANSACTIONAL, _CONTROL = 0x10, 0x20


@dataclasses.dataclass(frozen=True)
class Batch:
    base_offset: int
    last_offset: int
    producer_id: int
    transactional: bool
    control: str = ""  # "commit" or "abort" for a control batch


def batches(data: bytes) -> Iterator[Batch]:
    """The record batches of a .log segment (Kafka's format v2); stops at a torn tail."""
    at = 0
    while at + _BATCH_HEADER.size <= len(data):
        (base, length, _leader_epoch, magic, _crc, attributes, last_delta, _t0, _t1, pid,
         _epoch, _seq, _count) = _BATCH_HEADER.unpack_from(data, at)  # fmt: skip
        end = at + 12 + length
        if magic != 2 or end > len(data):
            return
        control = ""
        if attributes & _CONTROL:
            control = _marker(data[at + _BATCH_HEADER.size : end])
        yield Batch(base, base + last_delta, pid, bool(attributes & _TRANSACTIONAL), control)
        at = end


def _marker(records: bytes) -> str:
    """COMMIT or ABORT: the key (version, type) of a control batch's one record, after its
    length (varint), attributes (a byte), timestamp delta and offset delta (varints)."""
    _, at = _varint(records, 0)
    at += 1
    _, at = _varint(records, at)
    _, at = _varint(records, at)
    key_length, at = _varint(records, at)
    if key_length < 4:
        return ""
    _version, kind = struct.unpack_from(">hh", records, at)
    return {0: ABORT, 1: COMMIT}.get(kind, "")


def _varint(data: bytes, at: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), at  # zigzag
        shift += 7


def fates(segments: Iterable[Batch]) -> dict[int, str]:
    """offset -> commit/abort/open for every record of a transactional data batch: decided by
    its producer's next control batch in the partition."""
    pending: dict[int, list[Batch]] = defaultdict(list)
    out: dict[int, str] = {}
    for batch in segments:
        if batch.control:
            for data in pending.pop(batch.producer_id, []):
                out.update(
                    dict.fromkeys(range(data.base_offset, data.last_offset + 1), batch.control)
                )
        elif batch.transactional:
            pending[batch.producer_id].append(batch)
    for open_batches in pending.values():
        for data in open_batches:
            out.update(dict.fromkeys(_offsets(data), OPEN))
    return out


def _offsets(batch: Batch) -> range:
    return range(batch.base_offset, batch.last_offset + 1)


def _fates(node_dir: Path, topics: Iterable[str]) -> dict[tuple[str, int], dict[int, str]]:
    found: dict[tuple[str, int], dict[int, str]] = {}
    for topic in topics:
        for folder in sorted(node_dir.glob(f"{topic}-*")):
            partition = int(folder.name.rsplit("-", 1)[1])
            segments = (
                batch for log in sorted(folder.glob("*.log")) for batch in batches(log.read_bytes())
            )
            found[(topic, partition)] = fates(segments)
    return found
