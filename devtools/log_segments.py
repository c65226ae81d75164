"""Each transactional record's fate (commit, abort, open), read straight from a local cluster's log
segments (record-batch format v2), for the history checker. Why the leader's log, once it holds
the high watermark: docs/local-kafka.md, "Network faults"."""

from __future__ import annotations

import dataclasses
import struct
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

COMMIT, ABORT, OPEN = "commit", "abort", "open"
LOG_WAIT_S = 30.0  # how long a partition's log may take to reach its high watermark
Locate = Callable[[str, int], tuple[int, int]]  # (topic, partition) -> (leader, high watermark)


@dataclasses.dataclass(frozen=True)
class LogRead:
    """Where the fates of one partition came from: `node`'s replica (-1: none could be read),
    read up to `end` (the offset after its last whole batch), against the partition's high
    watermark as its leader reported it (-1: no leader answered)."""

    topic: str
    partition: int
    node: int
    end: int
    high_watermark: int

    @property
    def complete(self) -> bool:
        return self.node >= 0 and 0 <= self.high_watermark <= self.end

    def describe(self) -> str:
        where = f"{self.topic}[{self.partition}]"
        if self.node < 0 or self.high_watermark < 0:
            return f"{where}: no leader's log could be read"
        if self.complete:
            hw = self.high_watermark
            return f"{where} from node {self.node}, complete to its high watermark {hw}"
        return (
            f"{where}: node {self.node}'s log ends at offset {self.end}, below the high watermark "
            f"{self.high_watermark}"
        )


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


def partition_batches(log_dir: Path, topic: str, partition: int) -> list[Batch]:
    """Every whole batch of one partition's replica in a node's log dir, segment by segment
    (nothing when the node holds no replica of it)."""
    folder = log_dir / f"{topic}-{partition}"
    found: list[Batch] = []
    for segment in sorted(folder.glob("*.log")):  # 20-digit base offsets: sorted by name
        try:
            found += batches(segment.read_bytes())
        except OSError:  # a segment deleted (rolled, cleaned) while we read
            continue
    return found


def read_log(
    log_dirs: Mapping[int, Path],
    topic: str,
    partition: int,
    locate: Locate,
    wait_s: float = LOG_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[LogRead, dict[int, str]]:
    """The fates of one partition from its leader's log, read again until that log holds the
    high watermark (the leader's write may be under way), for at most `wait_s`. An incomplete
    read keeps only the fates it saw decided: a batch whose marker lies past the end read is
    unknown, not open."""
    deadline = clock() + wait_s
    while True:
        try:
            leader, high_watermark = locate(topic, partition)
        except Exception:  # no leader now (an election): try again
            leader, high_watermark = -1, -1
        if leader in log_dirs:
            read = partition_batches(log_dirs[leader], topic, partition)
            end = read[-1].last_offset + 1 if read else 0
            log = LogRead(topic, partition, leader, end, high_watermark)
        else:
            read, log = [], LogRead(topic, partition, -1, 0, high_watermark)
        if log.complete or clock() >= deadline:
            break
        sleep(0.5)
    found = fates(read)
    if not log.complete:
        found = {offset: fate for offset, fate in found.items() if fate != OPEN}
    return log, found


class Locator:
    """Each partition's leader and high watermark (read_uncommitted: the high watermark, not
    the last stable offset), as the cluster's metadata and the leader report them."""

    def __init__(self, client: dict[str, str]) -> None:
        self._consumer = Consumer(
            {
                **client,
                "group.id": "codeclog-history",
                "enable.auto.commit": False,
                "isolation.level": "read_uncommitted",
                "log_level": 2,
            }
        )

    def __enter__(self) -> Locate:
        return self.locate

    def __exit__(self, *_exc: object) -> None:
        self._consumer.close()

    def locate(self, topic: str, partition: int) -> tuple[int, int]:
        metadata = self._consumer.list_topics(topic, timeout=10)
        leader = int(metadata.topics[topic].partitions[partition].leader)
        _low, high = self._consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=10, cached=False
        )
        return leader, int(high)
