"""The connector receiver's index: records read from the topic, each key handed out once.

`CodeclogKafkaConnector` (omni.connector) fills it from its background consumer and serves
`get` from it, under its own lock; this class does no I/O and takes no lock. A key (put key,
from stage, to stage) is handed out once, as vllm-omni's shared-memory connector does: another
record with a key that waits or was handed out (a producer retry that landed twice) is dropped
and counted `redelivered`; the same record read again (the put's own copy, which the connector
indexes as soon as the broker acknowledged it) is dropped silently.

What the index keeps of a request ends with the request, because vllm-omni's chunk adapter
calls `cleanup` only for its shared-memory connector:
- handing out a request's terminal entry (`meta.finished`) forgets the request (`finished`);
- a request with nothing handed out or indexed for `idle_s` is forgotten and its waiting entries
  dropped (`expired`): a request routed to another replica, whose entries nobody here asks for,
  or one the engine aborted without a terminal;
- `forget` (the connector's `cleanup`) drops a request, or one put key, at once;
- past `max_entries` the oldest waiting entry is dropped (`evicted`).
The receiver commits below the oldest entry not handed out yet (`commit_offsets`), so a restarted
receiver re-reads what it had not delivered.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, defaultdict
from typing import Any

from codeclog.omni.payload import parse_put_key

IndexKey = tuple[str, str, str]  # (put key, from stage, to stage)
Position = tuple[int, int]  # (partition, offset)


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One record waiting for its get: the payload and where the record sits."""

    payload: Any
    size: int
    partition: int
    offset: int
    terminal: bool = False  # the request's last payload: handing it out ends the request

    @property
    def position(self) -> Position:
        return self.partition, self.offset


def request_of(key: IndexKey) -> str:
    """The external request id of a key (its put key's first part)."""
    return parse_put_key(key[0])[0]


class HandOutIndex:
    """Entries by key, each handed out once (see the module docstring)."""

    def __init__(self, max_entries: int, idle_s: float = 600.0) -> None:
        self.max_entries = max_entries
        self.idle_s = idle_s
        self.counts: dict[str, int] = defaultdict(int)
        self._entries: OrderedDict[IndexKey, Entry] = OrderedDict()
        self._waiting: dict[str, set[IndexKey]] = {}  # request -> its keys waiting
        self._handed: dict[str, dict[IndexKey, Position]] = {}  # request -> keys handed out
        self._touched: dict[str, float] = {}  # request -> last add or take (monotonic s)
        self._pending: dict[int, set[int]] = defaultdict(set)  # partition -> offsets waiting
        self._read: dict[int, int] = {}  # partition -> next offset to read

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def requests(self) -> int:
        """Requests the index keeps anything of (waiting entries or handed-out keys)."""
        return len(self._touched)

    @property
    def handed(self) -> int:
        """Handed-out keys remembered (of requests not ended yet)."""
        return sum(len(keys) for keys in self._handed.values())

    def read(self, partition: int, offset: int) -> None:
        """A record at this position was read (whether or not it is added)."""
        self._read[partition] = max(self._read.get(partition, 0), offset + 1)

    def add(self, key: IndexKey, entry: Entry, now: float) -> bool:
        """Index a record; False for a copy of a key that waits or was handed out already."""
        request = request_of(key)
        waiting = self._entries.get(key)
        handed = self._handed.get(request, {}).get(key)
        if waiting is not None or handed is not None:
            if entry.position not in (handed, waiting.position if waiting else None):
                self.counts["redelivered"] += 1
            return False
        self._entries[key] = entry
        self._waiting.setdefault(request, set()).add(key)
        self._pending[entry.partition].add(entry.offset)
        self._touched[request] = now
        self.counts["indexed"] += 1
        while len(self._entries) > self.max_entries:
            oldest = next(iter(self._entries))
            self._drop(oldest)
            self.counts["evicted"] += 1
        return True

    def take(self, key: IndexKey, now: float) -> Entry | None:
        """Hand out the entry of `key` (once); a terminal entry ends its request."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._drop(key)
        self.counts["gets"] += 1
        request = request_of(key)
        if entry.terminal:
            self._end(request)
            self.counts["finished"] += 1
        else:
            self._handed.setdefault(request, {})[key] = entry.position
            self._touched[request] = now
        return entry

    def forget(self, name: str) -> None:
        """Drop a request (by request id) or one waiting key (by put key)."""
        for key in [k for k in self._entries if k[0] == name]:
            self._drop(key)
        self._end(name)

    def expire(self, now: float) -> None:
        """Forget the requests idle for `idle_s` (see the module docstring)."""
        idle = [request for request, at in self._touched.items() if now - at >= self.idle_s]
        for request in idle:
            self.counts["expired"] += len(self._waiting.get(request, ()))
            self._end(request)

    def read_position(self, partition: int) -> int:
        """The next offset to read in a partition (0 before any)."""
        return self._read.get(partition, 0)

    def commit_offsets(self) -> dict[int, int]:
        """Per partition read so far: the offset to commit, below the oldest entry waiting."""
        return {p: min(self._pending[p], default=high) for p, high in self._read.items()}

    def _drop(self, key: IndexKey) -> None:
        """Remove a waiting entry (and the request, once nothing of it is kept)."""
        entry = self._entries.pop(key)
        self._pending[entry.partition].discard(entry.offset)
        request = request_of(key)
        keys = self._waiting.get(request)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._waiting[request]
        if request not in self._waiting and request not in self._handed:
            self._touched.pop(request, None)

    def _end(self, request: str) -> None:
        """Forget everything of a request."""
        for key in list(self._waiting.get(request, ())):
            self._drop(key)
        self._handed.pop(request, None)
        self._touched.pop(request, None)
