"""The independent history checker (codeclog.devtools.history): each anomaly kind found in a
hand-made history that contains it, none in a clean one; records it cannot decode as findings;
and the log-segment reader on hand-made record batches (Kafka's format v2) laid out as a
cluster's replicas, one of them behind: the fates come from a log that holds the high
watermark, or the partition is reported incomplete. On a real cluster: test_cluster_faults.py."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from codeclog.devtools.audit import shipped_schemas
from codeclog.devtools.history import (
    KINDS,
    Chunk,
    History,
    Output,
    Topics,
    check,
    decode_chunks,
    decode_outputs,
    describe_logs,
    read_history,
)
from codeclog.devtools.log_segments import (
    ABORT,
    COMMIT,
    OPEN,
    LogRead,
    batches,
    fates,
    partition_batches,
    read_log,
)
from codeclog.schemas import wire
from codeclog.schemas.records import AudioChunk, CodecChunk, DeadLetter

AUDIO, DLQ, PROGRESS = "audio", "dlq", "progress"


def window(
    offset: int, index: int, seqs: tuple[int, ...], committed: bool = True, fate: str = COMMIT,
    request: str = "r", samples: int = 4,
) -> Output:  # fmt: skip
    fields: dict[str, Any] = {
        "request_id": request,
        "cache_epoch": 0,
        "window_index": index,
        "chunk_seqs": list(seqs),
        "sample_offset": index * samples,
        "pcm_s16le": b"\0\0" * samples,
    }
    return Output(AUDIO, 0, offset, "window", fields, committed, fate)


def checkpoint(offset: int, emitted: int, is_open: bool = True) -> Output:
    fields = {"request_id": "r", "cache_epoch": 0, "open": is_open, "windows_emitted": emitted}
    return Output(PROGRESS, 0, offset, "checkpoint", fields, True, COMMIT)


def letter(offset: int, source_offset: int, reason: str) -> Output:
    fields = {
        "request_id": "r",
        "cache_epoch": 0,
        "reason": reason,
        "source_partition": 0,
        "source_offset": source_offset,
    }
    return Output(DLQ, 0, offset, "letter", fields, True, COMMIT)


CHUNKS = [Chunk(0, seq, "r", 0, seq, 5) for seq in range(3)]


def clean() -> History:
    outputs = [window(0, 0, (0,)), window(2, 1, (1,)), window(4, 2, (2,)), checkpoint(0, 3)]
    return History(list(CHUNKS), outputs, {0: 3})


def found(history: History) -> dict[str, int]:
    return {kind: len(items) for kind, items in check(history).items() if items}


def test_a_clean_history_has_no_anomaly() -> None:
    assert set(check(clean())) == set(KINDS) and found(clean()) == {}


def test_a_chunk_below_the_committed_offset_without_its_window_is_lost() -> None:
    history = clean()
    history.outputs = [o for o in history.outputs if o.fields.get("window_index") != 1]
    history.outputs[-1] = checkpoint(0, 3, is_open=False)  # not torn: the stream closed
    assert found(history) == {"lost": 1}


def test_a_chunk_above_the_committed_offset_is_not_owed_yet() -> None:
    history = clean()
    history.outputs = [o for o in history.outputs if o.fields.get("window_index") != 2]
    history.outputs[-1] = checkpoint(0, 2)
    history.committed_offsets = {0: 2}
    assert found(history) == {}


def test_a_dead_letter_accounts_for_its_chunk_and_an_eviction_for_its_epoch() -> None:
    history = clean()
    history.outputs = [window(0, 0, (0,)), letter(0, 1, "invalid_codes"), letter(1, 2, "x")]
    history.outputs.append(checkpoint(0, 1, is_open=False))
    history.outputs.append(letter(2, 99, "evicted"))
    assert found(history) == {}


def test_a_window_committed_twice_is_duplicated() -> None:
    history = clean()
    history.outputs.append(window(6, 1, (1,)))
    assert found(history) == {"duplicated": 2}  # the window and its chunk


def test_a_committed_read_of_an_aborted_batch_is_an_aborted_read() -> None:
    history = clean()
    history.outputs[1] = window(2, 1, (1,), committed=True, fate=ABORT)
    assert found(history) == {"aborted_read": 1}


def test_an_aborted_copy_no_reader_returns_is_fine() -> None:
    history = clean()
    history.outputs.append(window(6, 1, (1,), committed=False, fate=ABORT))
    assert found(history) == {}


def test_audio_without_its_checkpoint_is_torn() -> None:
    history = clean()
    history.outputs[-1] = checkpoint(0, 2)  # the step that wrote window 2 lost its checkpoint
    assert found(history) == {"torn": 1}


def test_windows_out_of_log_order_are_reported() -> None:
    history = clean()
    history.outputs[0], history.outputs[1] = window(2, 0, (0,)), window(0, 1, (1,))
    assert found(history) == {"out_of_order": 1}


# --- log segments -------------------------------------------------------------------------


def _batch(base: int, count: int, pid: int, transactional: bool, marker: int | None) -> bytes:
    """A record batch v2 header (+ a control record when `marker` is 0 abort / 1 commit)."""
    attributes = (0x10 if transactional else 0) | (0x20 if marker is not None else 0)
    records = b""
    if marker is not None:
        key = struct.pack(">hh", 0, marker)
        body = b"\0" + b"\0" + b"\0" + bytes([len(key) * 2]) + key + b"\x01" + b"\0"
        records = bytes([len(body) * 2]) + body  # varints, zigzag
    header = struct.pack(">iBIhiqqqhii", 0, 2, 0, attributes, count - 1, 0, 0, pid, 0, 0, count)
    return struct.pack(">qi", base, len(header) + len(records)) + header + records


def test_batches_and_their_fates_come_from_the_markers() -> None:
    log = (
        _batch(0, 2, 7, True, None)  # producer 7: two records, then aborted
        + _batch(2, 1, 8, True, None)  # producer 8: committed
        + _batch(3, 1, 7, True, 0)
        + _batch(4, 1, 8, True, 1)
        + _batch(5, 1, 7, True, None)  # still open
        + _batch(6, 1, 9, False, None)  # not transactional
        + b"\0\0\0"  # a torn tail
    )
    read = list(batches(log))
    assert [(b.base_offset, b.control) for b in read] == [
        (0, ""), (2, ""), (3, "abort"), (4, "commit"), (5, ""), (6, ""),
    ]  # fmt: skip
    assert fates(read) == {0: "abort", 1: "abort", 2: "commit", 5: "open"}


def test_a_window_not_starting_where_the_one_before_ended_is_out_of_order() -> None:
    history = clean()
    shifted = window(4, 2, (2,))
    shifted.fields["sample_offset"] = 9  # window 1 ended at sample 8
    history.outputs[2] = shifted
    assert found(history) == {"out_of_order": 1}


# --- what cannot be decoded -------------------------------------------------------------------


def _chunk_value(seq: int) -> bytes:
    return wire.encode(CodecChunk(request_id="r", codes=(1, 2, 3, 4, 5), chunk_seq=seq))


def test_a_truncated_chunk_is_a_finding_unless_a_dead_letter_accounts_for_it() -> None:
    truncated = _chunk_value(1)[:-3]  # fastavro raises EOFError on it
    records = [(0, 0, _chunk_value(0)), (0, 1, truncated), (0, 2, _chunk_value(2))]
    chunks, bad = decode_chunks("chunks", records, shipped_schemas())
    assert [c.seq for c in chunks] == [0, 2]
    assert [(u.topic, u.partition, u.offset, u.kind) for u in bad] == [("chunks", 0, 1, "chunk")]
    assert bad[0].reason.startswith("EOFError")
    history = History(chunks, [window(0, 0, (0,)), window(2, 1, (2,))], {0: 3}, bad)
    history.outputs.append(checkpoint(0, 2, is_open=False))
    assert check(history)["undecodable"] == [
        "chunks[0]@1: cannot decode (EOFError: ...), and no dead letter accounts for it"
        .replace("EOFError: ...", bad[0].reason)
    ]  # fmt: skip
    history.outputs.append(letter(0, 1, "undecodable"))  # the pipeline refused it: as it should
    assert found(history) == {}


def test_an_undecodable_output_record_is_a_finding() -> None:
    pcm = b"\0\0" * 4
    good = wire.encode(
        AudioChunk("r", 0, (0,), 0, 0, 24_000, pcm, hashlib.sha256(pcm).hexdigest(), False)
    )
    outputs, bad = decode_outputs(
        AUDIO, "window", [(0, 0, good), (0, 1, good[:-2]), (0, 2, b"garbage")], {(0, 0), (0, 1)},
        shipped_schemas(), {(AUDIO, 0): {0: COMMIT}},
    )  # fmt: skip
    assert [(o.offset, o.committed, o.fate) for o in outputs] == [(0, True, COMMIT)]
    history = History([], outputs, {}, bad)
    problems = check(history)["undecodable"]
    assert len(problems) == 2 and problems[0].startswith("audio[0]@1: cannot decode (")
    assert problems[1].endswith("(aborted: no read_committed reader returns it)")


def test_the_fault_matrix_records_a_failing_checker_and_goes_on(tmp_path: Path) -> None:
    from codeclog.devtools.cluster import LocalCluster
    from codeclog.devtools.fault_actions import FaultContext
    from codeclog.devtools.faults import CHECKER_FAILED, check_history
    from codeclog.devtools.members import Members
    from codeclog.topics_config import TopicsConfig

    topics = TopicsConfig(chunks="c", audio="a", dlq="d", progress="p", partitions=1)
    # no cluster in that dir: reading the history fails at once
    gone = LocalCluster(tmp_path / "gone")
    ctx = FaultContext(gone, {}, topics, tmp_path, "g", Members(tmp_path))
    anomalies, logs = check_history(ctx)
    assert list(anomalies) == [CHECKER_FAILED] and "ClusterError" in anomalies[CHECKER_FAILED][0]
    assert logs.startswith("not read")


# --- a complete log: the leader's, holding the high watermark -------------------------------


def _segment(log_dir: Path, partition: str, data: bytes) -> Path:
    folder = log_dir / partition
    folder.mkdir(parents=True)
    path = folder / "00000000000000000000.log"
    path.write_bytes(data)
    return path


def _replicas(tmp_path: Path) -> tuple[dict[int, Path], Path]:
    """Node 2 (the leader) holds a committed transaction: data at 0-1, COMMIT at 2. Node 1
    went down after the data reached it and before the marker did."""
    data = _batch(0, 2, 7, True, None)
    dirs = {n: tmp_path / f"node-{n}" / "kafka" for n in (1, 2)}
    lagging = _segment(dirs[1], f"{AUDIO}-0", data)
    _segment(dirs[2], f"{AUDIO}-0", data + _batch(2, 1, 7, True, 1))
    return dirs, lagging


def test_the_leaders_log_gives_the_fates_and_says_so(tmp_path: Path) -> None:
    dirs, _ = _replicas(tmp_path)
    log, found = read_log(dirs, AUDIO, 0, lambda _t, _p: (2, 3), wait_s=0)
    assert log == LogRead(AUDIO, 0, 2, 3, 3) and log.complete
    assert found == {0: COMMIT, 1: COMMIT}
    assert describe_logs([log]) == (
        "fates from the leaders' logs, each complete to its high watermark: audio[0] node 2"
    )
    # what reading node 1's log alone made of it: the committed transaction looks open
    assert fates(partition_batches(dirs[1], AUDIO, 0)) == {0: OPEN, 1: OPEN}


def test_a_log_short_of_the_high_watermark_is_incomplete_not_an_aborted_read(
    tmp_path: Path,
) -> None:
    dirs, _ = _replicas(tmp_path)
    # node 1 named as the leader, its log never reaching the high watermark 3
    log, known = read_log(dirs, AUDIO, 0, lambda _t, _p: (1, 3), wait_s=0)
    assert not log.complete and log.end == 2 and known == {}  # open is unknown here
    outputs = [window(0, 0, (0,), fate=known.get(0, "")), window(1, 1, (1,), fate="")]
    history = History(list(CHUNKS[:2]), outputs, {0: 2}, logs=[log])
    assert check(history)["incomplete_log"] == [
        "audio[0]: node 1's log ends at offset 2, below the high watermark 3"
    ]
    assert found(history) == {"incomplete_log": 1}
    missing, _ = read_log(dirs, AUDIO, 0, lambda _t, _p: (9, 3), wait_s=0)  # not a node of ours
    assert not missing.complete and missing.describe() == "audio[0]: no leader's log could be read"


def test_the_checker_waits_until_the_log_it_reads_holds_the_high_watermark(
    tmp_path: Path,
) -> None:
    dirs, lagging = _replicas(tmp_path)
    waits: list[float] = []

    def catch_up(seconds: float) -> None:  # node 1 fetches the marker while the checker waits
        waits.append(seconds)
        lagging.write_bytes(lagging.read_bytes() + _batch(2, 1, 7, True, 1))

    log, found = read_log(dirs, AUDIO, 0, lambda _t, _p: (1, 3), wait_s=60, sleep=catch_up)
    assert len(waits) == 1 and log.complete and log.node == 1
    assert found == {0: COMMIT, 1: COMMIT}


@pytest.mark.kafka
def test_read_history_records_what_it_cannot_decode_on_a_real_broker(
    kafka_bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    client = {"bootstrap.servers": kafka_bootstrap}
    topics = Topics(*(new_topic(role) for role in ("chunks", "audio", "dlq", "progress")))
    truncated = _chunk_value(1)[:-3]
    pcm = b"\0\0" * 4
    audio = wire.encode(
        AudioChunk("r", 0, (0,), 0, 0, 24_000, pcm, hashlib.sha256(pcm).hexdigest(), False)
    )
    letter_value = wire.encode(
        DeadLetter("undecodable", topics.chunks, 0, 1, truncated, request_id="r")
    )
    producer = Producer(client)
    for topic, value in [
        (topics.chunks, _chunk_value(0)),
        (topics.chunks, truncated),  # the pipeline dead-letters it: not an anomaly
        (topics.dlq, letter_value),
        (topics.audio, audio),
        (topics.audio, audio[:-2]),  # an output nobody can decode: an anomaly
    ]:
        producer.produce(topic, value, key=b"r", partition=0)
    assert producer.flush(30) == 0
    history = read_history(client, topics, unique_name("group"))
    assert [(u.topic, u.offset) for u in history.undecodable] == [
        (topics.chunks, 1),
        (topics.audio, 1),
    ]
    problems = {kind: items for kind, items in check(history).items() if items}
    assert list(problems) == ["undecodable"] and len(problems["undecodable"]) == 1
    assert problems["undecodable"][0].startswith(f"{topics.audio}[0]@1: cannot decode")
