"""The connector receiver's index: records read from the topic, each key handed out once.

`CodeclogKafkaConnector` (omni.connector) fills it from its background consumer and serves
`get` from it, under its own lock; this class does no I/O and takes no lock. A key (put key,
from stage, to stage) is handed out once, as vllm-omni's shared-memory connector does: a copy
that arrives while the key waits, or after it was handed out (a redelivery after a receiver
restart, a producer retry that landed twice), is dropped and counted `redelivered`, until
`forget(request_id)` ends that request. Past `max_entries` the oldest waiting entry is dropped
(`evicted`). The receiver commits below the oldest entry not handed out yet
(`commit_offsets`), so a restarted receiver re-reads what it had not delivered.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, defaultdict
from typing import Any

from codeclog.omni.payload import parse_put_key

IndexKey = tuple[str, str, str]  # (put key, from stage, to stage)


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One record waiting for its get: the payload and where the record sits."""

    payload: Any
    size: int
    partition: int
    offset: int


def request_of(key: IndexKey) -> str:
    """The external request id of a key (its put key's first part)."""
    return parse_put_key(key[0])[0]


class HandOutIndex:
    """Entries by key, each handed out once (see the module docstring)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.counts: dict[str, int] = defaultdict(int)  # indexed, redelivered, evicted, gets
        self._entries: OrderedDict[IndexKey, Entry] = OrderedDict()
        self._handed: dict[str, set[IndexKey]] = defaultdict(set)  # per request id
        self._pending: dict[int, set[int]] = defaultdict(set)  # partition -> offsets waiting
        self._read: dict[int, int] = {}  # partition -> next offset to read

    def __len__(self) -> int:
        return len(self._entries)

    def read(self, partition: int, offset: int) -> None:
        """A record at this position was read (whether or not it is added)."""
        self._read[partition] = offset + 1

    def add(self, key: IndexKey, entry: Entry) -> bool:
        """Index a record; False (counted `redelivered`) for a copy of a key that waits or
        was handed out already."""
        if key in self._entries or key in self._handed.get(request_of(key), ()):
            self.counts["redelivered"] += 1
            return False
        self._entries[key] = entry
        self._pending[entry.partition].add(entry.offset)
        self.counts["indexed"] += 1
        while len(self._entries) > self.max_entries:
            _key, old = self._entries.popitem(last=False)
            self._pending[old.partition].discard(old.offset)
            self.counts["evicted"] += 1
        return True

    def take(self, key: IndexKey) -> Entry | None:
        """Hand out the entry of `key` (once: it is then remembered as handed out)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._pending[entry.partition].discard(entry.offset)
        self._handed[request_of(key)].add(key)
        self.counts["gets"] += 1
        return entry

    def forget(self, request_id: str) -> None:
        """Drop a request's waiting entries and what was handed out of it."""
        for key in [k for k in self._entries if request_of(k) == request_id]:
            entry = self._entries.pop(key)
            self._pending[entry.partition].discard(entry.offset)
        self._handed.pop(request_id, None)

    def read_position(self, partition: int) -> int:
        """The next offset to read in a partition (0 before any)."""
        return self._read.get(partition, 0)

    def commit_offsets(self) -> dict[int, int]:
        """Per partition read so far: the offset to commit, below the oldest entry waiting."""
        return {p: min(self._pending[p], default=high) for p, high in self._read.items()}
