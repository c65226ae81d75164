"""Replay inputs: a capture file (OCF) or a JSONL scenario, told apart by the `Obj\\x01` magic.
Reasons: docs/replay.md, "Replay"."""

from __future__ import annotations

import dataclasses
import enum
import io
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from codeclog.replay.capture_blocks import SkippedBlock
from codeclog.replay.capture_format import (
    OCF_MAGIC,
    CapturedRecord,
    CaptureMetadata,
    read_records,
)
from codeclog.replay.columns import CaptureTable, read_table
from codeclog.replay.errors import CaptureFormatError, InputFormatError
from codeclog.schemas.records import CodecChunk, ControlEvent
from codeclog.terminal_text import printable
from codeclog.user_files import UserFileError, file_kind, open_binary, user_file_error

MAX_PIPE_BYTES = 4 << 30  # what a pipe may hold; a regular file has no such limit
_CHUNK = 1 << 20


class InputKind(enum.Enum):
    CAPTURE = "capture"
    SCENARIO = "scenario"


@dataclasses.dataclass(frozen=True)
class ReplayInput:
    """What a replay runs on. Captures hold records in log order; scenarios hold events.

    A capture read as columns (`replay.columns`) has its `table`, which is also its `records`
    (built on first access); the state-only replay reads the columns.
    """

    kind: InputKind
    name: str  # the file name without directories, printable: it goes into the report
    metadata: CaptureMetadata | None = None
    records: Sequence[CapturedRecord] = ()
    events: tuple[CodecChunk | ControlEvent, ...] = ()
    truncated: bool = False  # the capture's last block was torn (a crashed capture)
    table: CaptureTable | None = None
    skipped: tuple[SkippedBlock, ...] = ()  # corrupt blocks skipped (--skip-corrupt-blocks)

    def describe(self) -> dict[str, object]:
        """The `input` object of the report (`skipped_blocks` only when blocks were skipped)."""
        size = len(self.records) if self.kind is InputKind.CAPTURE else len(self.events)
        described: dict[str, object] = {
            "kind": self.kind.value,
            "name": self.name,
            "size": size,
            "truncated": self.truncated,
        }
        if self.skipped:
            described["skipped_blocks"] = [block.describe() for block in self.skipped]
        return described


def log_order(records: Sequence[CapturedRecord]) -> tuple[CapturedRecord, ...]:
    """Per-partition offset order (E.10 rule 1): a request lives in one partition, so this keeps
    every request's order; partitions are concatenated in number order, which only changes how
    requests interleave, and the fold isolates requests."""
    return tuple(sorted(records, key=lambda r: (r.partition, r.offset)))


def load_input(path: str | Path, skip_corrupt_blocks: bool = False) -> ReplayInput:
    """The capture or scenario at `path`. A corrupt capture block is an error naming it, unless
    `skip_corrupt_blocks` (then the input says what was skipped)."""
    where = Path(path)
    try:
        with _open(where) as fo:
            if fo.read(len(OCF_MAGIC)) == OCF_MAGIC:
                return _load_capture(fo, where, skip_corrupt_blocks)
            fo.seek(0)
            return _load_scenario(fo.read(), where)
    except OSError as exc:
        raise user_file_error("read", "input", path, exc) from exc
    except CaptureFormatError as exc:  # its message says what, this says which file
        raise CaptureFormatError(f"{printable(str(where))}: {exc}") from exc


def _open(path: Path) -> IO[bytes]:
    """The input as a seekable binary file: a regular file itself, a pipe read into memory."""
    fo = open_binary(path, "input")
    mode = os.fstat(fo.fileno()).st_mode
    if stat.S_ISREG(mode):
        return fo
    with fo:
        if stat.S_ISFIFO(mode):
            return io.BytesIO(_read_pipe(fo, path))
    raise UserFileError(f"cannot read input {path}: {file_kind(mode)}, not a file or a pipe")


def _read_pipe(fo: IO[bytes], path: Path) -> bytes:
    parts: list[bytes] = []
    held = 0
    while chunk := fo.read(_CHUNK):
        held += len(chunk)
        if held > MAX_PIPE_BYTES:
            raise UserFileError(
                f"cannot read input {path}: the pipe holds more than {MAX_PIPE_BYTES >> 30} GiB; "
                "write it to a file and replay that"
            )
        parts.append(chunk)
    return b"".join(parts)


def _load_capture(fo: IO[bytes], path: Path, skip_corrupt: bool) -> ReplayInput:
    name = printable(path.name)
    fo.seek(0)
    table = read_table(fo, skip_corrupt)
    if table is not None:
        return ReplayInput(
            InputKind.CAPTURE,
            name,
            table.metadata,
            table,
            truncated=table.truncated,
            table=table,
            skipped=table.skipped,
        )
    fo.seek(0)
    capture = read_records(fo, skip_corrupt)
    return ReplayInput(
        InputKind.CAPTURE,
        name,
        capture.metadata,
        log_order(capture.records),
        truncated=capture.truncated,
        skipped=capture.skipped,
    )


def _load_scenario(data: bytes, path: Path) -> ReplayInput:
    from codeclog.replay.scenario import ScenarioError, parse_scenario

    shown = printable(str(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputFormatError(
            f"{shown} is neither a capture file (no Obj\\x01 magic) nor a JSONL scenario"
        ) from None
    try:
        events = parse_scenario(text.splitlines(), shown)
    except ScenarioError as exc:
        raise InputFormatError(
            f"{shown} is neither a capture file nor a valid JSONL scenario: {exc}"
        ) from exc
    return ReplayInput(InputKind.SCENARIO, printable(path.name), events=tuple(events))
