"""A receiver replaced mid-request, without Kafka: the index, its commits and its ledger marks
are all a successor has (omni.index, omni.ledger's rule). Whatever the interleaving, the
moment of the last commit and of the kill, and however many of the newest marks were still in
flight, the successor hands out every request that had not ended from chunk 0, whole and in
order, and nothing of a request whose ending reached the ledger."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.omni.index import Entry, HandOutIndex, IndexKey

PARTITIONS = 2


def _key(request: int, chunk: int) -> IndexKey:
    return (f"r{request}_1_{chunk}", "1", "2")


@dataclasses.dataclass(frozen=True)
class Record:
    request: int
    chunk: int
    terminal: bool
    partition: int
    offset: int


def _log(lengths: list[int], order: list[int]) -> list[Record]:
    """The talker's records: request i's chunks in order, interleaved as `order` picks (what
    it does not place follows in request order)."""
    pending = [i for i, n in enumerate(lengths) for _ in range(n)]
    sequence = [pending.pop(pick % len(pending)) for pick in order[: len(pending)]] + pending
    next_chunk = [0] * len(lengths)
    ends = [0] * PARTITIONS
    log = []
    for request in sequence:
        chunk, partition = next_chunk[request], request % PARTITIONS
        terminal = chunk == lengths[request] - 1
        log.append(Record(request, chunk, terminal, partition, ends[partition]))
        next_chunk[request] += 1
        ends[partition] += 1
    return log


def _read(index: HandOutIndex, record: Record) -> None:
    index.read(record.partition, record.offset)
    payload = (record.request, record.chunk)
    entry = Entry(payload, 1, record.partition, record.offset, record.terminal)
    index.add(_key(record.request, record.chunk), entry, 0.0)


def _serve(index: HandOutIndex, requests: int, next_chunk: list[int], handed: list[list]) -> None:
    """The adapter: each request's next chunk while there is one."""
    for request in range(requests):
        while True:
            entry = index.take(_key(request, next_chunk[request]), 0.0)
            if entry is None:
                break
            handed[request].append(entry.payload)
            next_chunk[request] += 1


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5), min_size=1, max_size=8),
    order=st.lists(st.integers(0, 50), max_size=40),
    serve=st.lists(st.booleans(), max_size=40),
    kill=st.integers(0, 40),
    commit=st.integers(0, 40),
    lost=st.integers(0, 3),
)
def test_a_successor_hands_out_every_unfinished_request_from_chunk_0_and_no_ended_one(
    lengths: list[int], order: list[int], serve: list[bool], kill: int, commit: int, lost: int
) -> None:
    log = _log(lengths, order)
    kill = min(kill, len(log))
    commit = min(commit, kill)
    predecessor = HandOutIndex(10_000, idle_s=0.0)  # the commit rule alone keeps marks
    ledger: list[tuple[int, int]] = []  # (request, last offset) of each mark written
    next_chunk = [0] * len(lengths)
    handed_before: list[list] = [[] for _ in lengths]
    committed: dict[int, int] = {}
    floor = 0
    in_flight = []
    for step, record in enumerate(log[:kill]):
        _read(predecessor, record)
        if step < len(serve) and serve[step]:
            _serve(predecessor, len(lengths), next_chunk, handed_before)
        if step == commit - 1:  # the last commit before the kill
            committed = predecessor.commit_offsets()
            floor = predecessor.ledger_floor(len(ledger), 0.0)
        due, predecessor.marks_due = predecessor.marks_due, []
        in_flight.extend(due)
        if step >= commit:  # marks after the last commit may still be in flight at the kill
            continue
        for ending in in_flight:
            predecessor.marked(ending.request_id, len(ledger))
            ledger.append((int(ending.request_id[1:]), ending.last_offset))
        in_flight = []
    written = in_flight[: max(0, len(in_flight) - lost)]  # the newest `lost` never landed
    for ending in written:
        ledger.append((int(ending.request_id[1:]), ending.last_offset))
    marked = {request for request, _ in ledger}

    successor = HandOutIndex(10_000)
    for offset, (request, last) in enumerate(ledger[floor:], start=floor):
        ending = predecessor.ending(f"r{request}")
        assert ending is not None
        successor.restore(dataclasses.replace(ending, mark_offset=offset, last_offset=last))
    for record in log:  # the talker went on; each partition from its committed offset
        if record.offset >= committed.get(record.partition, 0):
            _read(successor, record)
    handed_after: list[list] = [[] for _ in lengths]
    _serve(successor, len(lengths), [0] * len(lengths), handed_after)

    for request, length in enumerate(lengths):
        ended = predecessor.ending(f"r{request}") is not None
        if ended and request in marked:
            assert handed_after[request] == [], request  # never handed out twice
        else:  # not ended, or its mark never landed: whole again, from chunk 0
            assert handed_after[request] == [(request, n) for n in range(length)], request
