"""A record as read from Kafka, before anything decodes it: where it sat and its raw bytes. Plain
values (no Kafka client imported here), so the pure stream core can take them and every reader
can make them."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class Position:
    """Where a record sits in the log."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class InputRecord:
    """A record as consumed: its position, key and raw value bytes."""

    position: Position
    key: bytes | None
    value: bytes
