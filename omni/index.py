"""The connector receiver's index: what it read of each request, handed out once, in order.

`CodeclogKafkaConnector` (omni.connector) fills it from its background consumer and serves
`get` from it, under its own lock; this class does no I/O and takes no lock. A key (put key,
from stage, to stage) is handed out once, as vllm-omni's shared-memory connector does: another
record with a key that waits or was handed out (a producer retry that landed twice) is dropped
and counted `redelivered`; the same record read again (the put's own copy, which the connector
indexes as soon as the broker acknowledged it) is dropped silently.

A request is a `Stream` from its first record read until it ends. It ends (an `Ending`):
- `finished`: its terminal entry (`meta.finished`) was handed out;
- `timed_out`: the adapter asked for its next chunk and nothing new of it arrived for the
  connector's `request_wait_s` (its talker died, or the log is out of reach); the connector
  then fails it through the adapter;
- `cleanup`: the connector's `cleanup` named it.
Each ending is written to the hand-out ledger (omni.ledger) as a mark, so a successor of this
receiver (a replacement process in the same consumer group) neither re-indexes nor hands out
a request that ended here. A later record of an ended request is dropped and counted
`late_dropped`, unless it is chunk 0: a new request under the same id.

The ledger gate. A request is handed out here, or refused for having ended, only once the
ledger was read to the end it had after the adapter first asked for it (`take`'s and
`asked_after_end`'s `synced_at`; the receiver reads it): another replica's mark of a request
that ended there, and the orchestrator's move of it (`moved`), reach this index before it
decides, whatever the timing of a re-submission.

Moves. The records of a request that ended at another replica are parked, not dropped (within
`max_entries` parked and for `idle_s`): when that replica died before the request's last
output reached the orchestrator, the orchestrator moves it here (omni.redispatch, a
`HandOutMove` on the ledger), its endings are void and it is handed out from chunk 0.

Not an ending, nothing written:
- a request the adapter never asked for, idle for `idle_s`, is forgotten (`expired`): one
  routed to another replica, read here because every replica reads every partition;
- past `max_entries` the oldest waiting entry is dropped (`evicted`).

Commits. Per partition the receiver commits the first offset of the oldest request it still
holds (`commit_offsets`): a successor re-reads every request that had not ended from its
first record, and so hands it out again from chunk 0, as the successor's adapter asks for it.
The ledger floor (`ledger_floor`) is where the successor reads the ledger from: no mark of a
request with records at or after a committed offset, or that ended within `idle_s`, lies below
it.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, defaultdict
from typing import Any

from codeclog.omni.payload import parse_put_key

IndexKey = tuple[str, str, str]  # (put key, from stage, to stage)
Position = tuple[int, int]  # (partition, offset)

FINISHED = "finished"
TIMED_OUT = "timed_out"
CLEANUP = "cleanup"
ENDING_REASONS = (FINISHED, TIMED_OUT, CLEANUP)


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


@dataclasses.dataclass(slots=True)
class Stream:
    """What the receiver holds of one request that has not ended."""

    partition: int  # -1 while nothing of it was read (the adapter asked first)
    first_offset: int  # its first record read: the successor's re-read starts at or below it
    last_offset: int  # its newest record read
    touched: float  # last record read, get answered or asked (monotonic s)
    waiting: set[IndexKey] = dataclasses.field(default_factory=set)
    handed: dict[IndexKey, Position] = dataclasses.field(default_factory=dict)
    claimed: bool = False  # one of its keys was handed out here: the request is routed here
    asked: IndexKey | None = None  # the key the adapter asks for and has not got
    asked_since: float | None = None  # since when it asks for that key
    first_asked: float | None = None  # the adapter's first ask for it here (monotonic s)
    cleared: bool = False  # the ledger was read to its end after that ask (or this put it)


@dataclasses.dataclass(frozen=True, slots=True)
class Ending:
    """A request that ended here, or at a predecessor in the same group (from the ledger)."""

    request_id: str
    partition: int
    last_offset: int  # its last record read: none of its records up to here is indexed again
    reason: str  # one of ENDING_REASONS
    at: float  # when it ended (monotonic s; a restored one: when it was restored)
    mark_offset: int | None = None  # its mark's offset on the ledger, once written
    elsewhere: bool = False  # at another replica's group: its records here are parked


def request_of(key: IndexKey) -> str:
    """The external request id of a key (its put key's first part)."""
    return parse_put_key(key[0])[0]


def chunk_of(key: IndexKey) -> int | None:
    """The adapter's chunk counter in a key (None for a key of another form)."""
    return parse_put_key(key[0])[2]


class HandOutIndex:
    """Entries by key, each handed out once; requests until they end (module docstring)."""

    def __init__(self, max_entries: int, idle_s: float = 600.0) -> None:
        self.max_entries = max_entries
        self.idle_s = idle_s
        self.counts: dict[str, int] = defaultdict(int)
        self.marks_due: list[Ending] = []  # endings whose marks the connector has to write
        self._entries: OrderedDict[IndexKey, Entry] = OrderedDict()  # waiting, oldest first
        self._streams: dict[str, Stream] = {}
        self._ended: dict[str, Ending] = {}
        # ended, asked for again: the key and the first such ask (refused past the gate)
        self._asked_after_end: dict[str, tuple[IndexKey, float]] = {}
        # records of requests that ended elsewhere, oldest first: (parked at, their entries)
        self._parked: OrderedDict[str, tuple[float, list[tuple[IndexKey, Entry]]]] = OrderedDict()
        self._parked_entries = 0
        self._read: dict[int, int] = {}  # partition -> next offset to read

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def requests(self) -> int:
        """Requests the index holds anything of (read, handed out or asked for)."""
        return len(self._streams)

    @property
    def handed(self) -> int:
        """Handed-out keys remembered (of requests not ended yet)."""
        return sum(len(stream.handed) for stream in self._streams.values())

    @property
    def parked(self) -> int:
        """Records kept of requests that ended elsewhere (module docstring)."""
        return self._parked_entries

    @property
    def ended(self) -> int:
        """Endings remembered (until no record of theirs can be read again)."""
        return len(self._ended)

    def ending(self, request_id: str) -> Ending | None:
        return self._ended.get(request_id)

    def read(self, partition: int, offset: int) -> None:
        """A record at this position was read (whether or not it is added)."""
        self._read[partition] = max(self._read.get(partition, 0), offset + 1)

    # ------------------------------------------------------------------------------ records
    def add(self, key: IndexKey, entry: Entry, now: float, own: bool = False) -> bool:
        """Index a record; False for a copy, a record of an ended request, or a late one.
        `own`: this instance put it (its request passes the ledger gate)."""
        request = request_of(key)
        if not self._admits(request, key, entry, now):
            return False
        stream = self._streams.get(request)
        if stream is None or stream.partition < 0:
            stream = self._open(request, entry, now, stream)
        stream.cleared = stream.cleared or own
        waiting = self._entries.get(key)
        handed = stream.handed.get(key)
        if waiting is not None or handed is not None:
            if entry.position not in (handed, waiting.position if waiting else None):
                self.counts["redelivered"] += 1
            return False
        self._entries[key] = entry
        stream.waiting.add(key)
        stream.last_offset = max(stream.last_offset, entry.offset)
        stream.touched = now
        if key == stream.asked:  # what the adapter waits for arrived
            stream.asked = stream.asked_since = None
        self.counts["indexed"] += 1
        while len(self._entries) > self.max_entries:
            self._drop(next(iter(self._entries)))
            self.counts["evicted"] += 1
        return True

    def _admits(self, request: str, key: IndexKey, entry: Entry, now: float) -> bool:
        """Whether a record of `request` may be indexed (not one of a request that ended)."""
        ending = self._ended.get(request)
        if ending is None:
            return True
        if entry.partition == ending.partition and entry.offset <= ending.last_offset:
            if ending.elsewhere:  # the orchestrator may move it here (`moved`)
                self._park(request, [(key, entry)], now)
                return False
            self.counts["ended_skipped"] += 1  # read again: it ended here or at a predecessor
            return False
        if chunk_of(key) == 0:
            del self._ended[request]  # chunk 0 again: a new request under the same id
            self._asked_after_end.pop(request, None)
            self._unpark(request)
            return True
        self.counts["late_dropped"] += 1
        self._ended[request] = dataclasses.replace(ending, last_offset=entry.offset)
        return False

    def _open(self, request: str, entry: Entry, now: float, asked: Stream | None) -> Stream:
        """The stream of a request's first record (keeping what an earlier ask noted)."""
        stream = Stream(entry.partition, entry.offset, entry.offset, now)
        if asked is not None:
            stream.claimed, stream.handed = asked.claimed, asked.handed
            stream.asked, stream.asked_since = asked.asked, asked.asked_since
            stream.first_asked, stream.cleared = asked.first_asked, asked.cleared
        self._streams[request] = stream
        return stream

    # --------------------------------------------------------------------------- hand-outs
    def take(self, key: IndexKey, now: float, synced_at: float = float("inf")) -> Entry | None:
        """Hand out the entry of `key` (once); a terminal entry ends its request. A miss
        notes that the adapter waits for the request (`overdue` measures from then); so does
        a request held at the ledger gate: `synced_at` is when the receiver last knew the
        ledger read to its end (module docstring)."""
        request = request_of(key)
        entry = self._entries.get(key)
        if entry is None or not self._gate(request, now, synced_at):
            self._note_ask(request, key, now)
            return None
        self._drop(key)
        self.counts["gets"] += 1
        if entry.terminal:
            self.end(request, FINISHED, now)
            self.counts["finished"] += 1
            return entry
        stream = self._streams.get(request)
        if stream is None:  # its other entries were evicted: the request is this entry's
            stream = self._open(request, entry, now, None)
        stream.handed[key] = entry.position
        stream.claimed, stream.touched = True, now
        stream.asked = stream.asked_since = None
        return entry

    def _gate(self, request: str, now: float, synced_at: float) -> bool:
        """Whether the request passed the ledger gate: the ledger was read to its end after
        the adapter's first ask for it here."""
        stream = self._streams.get(request)
        if stream is None or stream.cleared:
            return True
        first = stream.first_asked if stream.first_asked is not None else now
        stream.first_asked = first
        stream.cleared = synced_at >= first
        return stream.cleared

    def _note_ask(self, request: str, key: IndexKey, now: float) -> None:
        if request in self._ended:
            _key, since = self._asked_after_end.get(request, (key, now))
            self._asked_after_end[request] = (key, since)
            return
        stream = self._streams.get(request)
        if stream is None:
            stream = self._streams[request] = Stream(-1, -1, -1, now)
        stream.touched = now
        if stream.first_asked is None:
            stream.first_asked = now
        if stream.asked != key:
            stream.asked, stream.asked_since = key, now

    def gate_since(self, synced_at: float) -> float | None:
        """The earliest first ask after `synced_at` of a request at the ledger gate (None:
        none waits): the receiver reads the ledger to an end it learns after this."""
        waiting = [
            stream.first_asked
            for stream in self._streams.values()
            if not stream.cleared
            and stream.first_asked is not None
            and stream.first_asked > synced_at
        ]
        refusing = [since for _key, since in self._asked_after_end.values() if since > synced_at]
        return min(waiting + refusing, default=None)

    def overdue(self, now: float, wait_s: float) -> list[str]:
        """Requests whose next chunk the adapter has asked for `wait_s` and not got."""
        if wait_s <= 0:
            return []
        return [
            request
            for request, stream in self._streams.items()
            if stream.asked_since is not None and now - stream.asked_since >= wait_s
        ]

    def asked_key(self, request: str) -> IndexKey | None:
        """The key the adapter asks for and the index lacks (None when it asks for none)."""
        stream = self._streams.get(request)
        return stream.asked if stream is not None else None

    def asked_after_end(self, synced_at: float = float("inf")) -> list[tuple[str, IndexKey]]:
        """(request, key) the adapter asked for although the request ended, reported once,
        past the ledger gate (asked at or before `synced_at`: no move of it was on the ledger
        then)."""
        due = sorted(
            (request, key)
            for request, (key, since) in self._asked_after_end.items()
            if since <= synced_at
        )
        for request, _key in due:
            del self._asked_after_end[request]
        return due

    def restart_waits(self, now: float) -> None:
        """Every wait counts from `now` (the receiver could not answer before: it was
        reading its ledger)."""
        for stream in self._streams.values():
            if stream.asked_since is not None:
                stream.asked_since = now

    # ----------------------------------------------------------------------------- endings
    def end(self, request: str, reason: str, now: float) -> Ending:
        """End a request: drop what waits of it, remember the ending, queue its mark."""
        stream = self._streams.pop(request, None)
        for key in list(stream.waiting if stream else ()):
            self._drop(key)
        partition = stream.partition if stream else -1
        last = stream.last_offset if stream else -1
        ending = Ending(request, partition, last, reason, now)
        self._ended[request] = ending
        self.marks_due.append(ending)
        return ending

    def marked(self, request: str, mark_offset: int) -> None:
        """The mark of a request's ending is on the ledger at `mark_offset`."""
        ending = self._ended.get(request)
        if ending is not None and ending.mark_offset is None:
            self._ended[request] = dataclasses.replace(ending, mark_offset=mark_offset)

    def restore(self, ending: Ending) -> None:
        """An ending a predecessor in this group wrote to the ledger (read before this
        receiver reads any record): the request is not indexed or handed out again."""
        known = self._ended.get(ending.request_id)
        if known is not None and known.last_offset > ending.last_offset:
            return
        self._ended[ending.request_id] = ending
        self.counts["restored_endings"] += 1
        stream = self._streams.get(ending.request_id)
        if stream is not None and stream.partition < 0:  # asked for before the ledger was read
            del self._streams[ending.request_id]
            if stream.asked is not None:
                since = stream.first_asked if stream.first_asked is not None else ending.at
                self._asked_after_end[ending.request_id] = (stream.asked, since)

    def ended_elsewhere(self, ending: Ending) -> None:
        """Another replica's group ended the request: unless the adapter here asked for it
        (it is routed here now), what this receiver read of it is dropped, and the rest of
        it will be."""
        stream = self._streams.get(ending.request_id)
        if stream is not None and (stream.claimed or stream.first_offset > ending.last_offset):
            return
        if stream is not None:
            entries = [(key, self._entries[key]) for key in stream.waiting]
            self._forget_stream(ending.request_id)
            self._park(ending.request_id, entries, ending.at)
        self._ended.setdefault(ending.request_id, dataclasses.replace(ending, elsewhere=True))
        self.counts["ended_elsewhere"] += 1

    def moved(self, request: str, now: float) -> None:
        """The orchestrator moved the request to another replica (a `HandOutMove` on the
        ledger): its endings are void, and what was parked of it is indexed again, so the
        replica it moved to hands it out from chunk 0."""
        self._ended.pop(request, None)
        asked = self._asked_after_end.pop(request, None)
        for key, entry in sorted(self._unpark(request), key=lambda item: item[1].position):
            self.add(key, entry, now)
        if asked is not None:
            self._note_ask(request, asked[0], now)
            self._streams[request].first_asked = asked[1]
        self.counts["moved"] += 1

    def _park(self, request: str, entries: list[tuple[IndexKey, Entry]], now: float) -> None:
        """Keep records of a request that ended elsewhere, within `max_entries` parked and
        for `idle_s` (`expire`)."""
        if not entries:
            return
        _at, parked = self._parked.setdefault(request, (now, []))
        parked.extend(entries)
        self._parked_entries += len(entries)
        while self._parked_entries > self.max_entries:
            self.counts["parked_evicted"] += len(self._unpark(next(iter(self._parked))))

    def _unpark(self, request: str) -> list[tuple[IndexKey, Entry]]:
        _at, parked = self._parked.pop(request, (0.0, []))
        self._parked_entries -= len(parked)
        return parked

    def forget(self, name: str, now: float) -> None:
        """End a request (by request id, `cleanup`), or drop one waiting key (by put key)."""
        if name in self._streams:
            self.end(name, CLEANUP, now)
            return
        for key in [k for k in self._entries if k[0] == name]:
            self._drop(key)

    def expire(self, now: float) -> None:
        """Forget idle requests nobody waits for, and endings no record can reach again."""
        for request, stream in list(self._streams.items()):
            idle = now - stream.touched >= self.idle_s
            if idle and stream.asked_since is None:
                self.counts["expired"] += len(stream.waiting)
                self._forget_stream(request)
        for request, (at, _parked) in list(self._parked.items()):
            if now - at >= self.idle_s:
                self._unpark(request)
        commits = self.commit_offsets()
        for request, ending in list(self._ended.items()):
            unreachable = ending.last_offset < commits.get(ending.partition, 0)
            if unreachable and now - ending.at >= self.idle_s and ending.mark_offset is not None:
                del self._ended[request]

    # ----------------------------------------------------------------------------- commits
    def read_position(self, partition: int) -> int:
        """The next offset to read in a partition (0 before any)."""
        return self._read.get(partition, 0)

    def commit_offsets(self) -> dict[int, int]:
        """Per partition read so far: the first offset of the oldest request held there."""
        firsts: dict[int, int] = {}
        for stream in self._streams.values():
            if stream.partition >= 0:
                known = firsts.get(stream.partition, stream.first_offset)
                firsts[stream.partition] = min(known, stream.first_offset)
        return {p: min(firsts.get(p, high), high) for p, high in self._read.items()}

    def ledger_floor(self, known_end: int, now: float) -> int:
        """Where a successor reads the ledger from: the lowest mark it needs, else
        `known_end`. It needs the mark of every request it may read again (a record at or
        after its partition's committed offset), and of every request that ended within
        `idle_s`, so that it refuses at once a request re-submitted after it ended."""
        commits = self.commit_offsets()
        marks = [
            ending.mark_offset
            for ending in self._ended.values()
            if ending.mark_offset is not None
            and (
                ending.last_offset >= commits.get(ending.partition, 0)
                or now - ending.at < self.idle_s
            )
        ]
        return min([*marks, known_end])

    # ------------------------------------------------------------------------------ helpers
    def _drop(self, key: IndexKey) -> None:
        """Remove a waiting entry (its stream stays)."""
        self._entries.pop(key)
        stream = self._streams.get(request_of(key))
        if stream is not None:
            stream.waiting.discard(key)

    def _forget_stream(self, request: str) -> None:
        stream = self._streams.pop(request)
        for key in list(stream.waiting):
            self._entries.pop(key, None)
