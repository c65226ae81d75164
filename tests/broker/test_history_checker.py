"""The independent history checker (codeclog.devtools.history): each anomaly kind found in a
hand-made history that contains it, none in a clean one; and the log-segment reader on
hand-made record batches (Kafka's format v2)."""

from __future__ import annotations

import struct
from typing import Any

from codeclog.devtools.history import (
    ABORT,
    COMMIT,
    KINDS,
    Chunk,
    History,
    Output,
    batches,
    check,
    fates,
)

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
