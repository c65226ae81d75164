"""Replay inputs: a capture file (OCF) or a JSONL scenario, told apart by the `Obj\\x01` magic."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from pathlib import Path

from codeclog.replay.capture_format import (
    CapturedRecord,
    CaptureMetadata,
    is_capture_file,
    read_capture,
)
from codeclog.replay.columns import CaptureTable, read_table
from codeclog.replay.errors import InputFormatError
from codeclog.schemas.records import CodecChunk, ControlEvent


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
    name: str  # the file name without directories: it goes into the report
    metadata: CaptureMetadata | None = None
    records: Sequence[CapturedRecord] = ()
    events: tuple[CodecChunk | ControlEvent, ...] = ()
    truncated: bool = False  # the capture's last block was torn (a crashed capture)
    table: CaptureTable | None = None

    def describe(self) -> dict[str, object]:
        """The `input` object of the report."""
        size = len(self.records) if self.kind is InputKind.CAPTURE else len(self.events)
        return {
            "kind": self.kind.value,
            "name": self.name,
            "size": size,
            "truncated": self.truncated,
        }


def log_order(records: Sequence[CapturedRecord]) -> tuple[CapturedRecord, ...]:
    """Per-partition offset order (E.10 rule 1): a request lives in one partition, so this keeps
    every request's order; partitions are concatenated in number order, which only changes how
    requests interleave, and the fold isolates requests."""
    return tuple(sorted(records, key=lambda r: (r.partition, r.offset)))


def load_input(path: str | Path) -> ReplayInput:
    where = Path(path)
    if is_capture_file(where):
        return _load_capture(where)
    return ReplayInput(InputKind.SCENARIO, where.name, events=tuple(_read_scenario(where)))


def _load_capture(path: Path) -> ReplayInput:
    table = read_table(path)
    if table is not None:
        return ReplayInput(
            InputKind.CAPTURE,
            path.name,
            table.metadata,
            table,
            truncated=table.truncated,
            table=table,
        )
    metadata, records, truncated = read_capture(path)
    return ReplayInput(
        InputKind.CAPTURE, path.name, metadata, log_order(records), truncated=truncated
    )


def _read_scenario(path: Path) -> list[CodecChunk | ControlEvent]:
    from codeclog.replay.scenario import ScenarioError, read_scenario

    try:
        return list(read_scenario(path))
    except ScenarioError as exc:
        raise InputFormatError(
            f"{path} is neither a capture file nor a valid JSONL scenario: {exc}"
        ) from exc
    except UnicodeDecodeError:
        raise InputFormatError(
            f"{path} is neither a capture file (no Obj\\x01 magic) nor a JSONL scenario"
        ) from None
