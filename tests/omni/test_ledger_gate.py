"""The ledger gate (omni.index `take`, omni.takeover `sync`), without Kafka: a request that
ended at another replica is never handed out here, however late this receiver reads that
replica's mark, when the adapter here asks for it after the mark reached the ledger (a dead
replica's requests re-submitted to this one); unless the orchestrator moved it here (a move
on the ledger after the mark): then it is handed out whole, from chunk 0."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.omni.index import FINISHED, Ending, Entry, HandOutIndex, IndexKey
from codeclog.omni.takeover import Takeover


def _key(request: str, chunk: int) -> IndexKey:
    return (f"{request}_1_{chunk}", "1", "2")


@dataclasses.dataclass
class Ledger:
    """The ledger partition as the broker holds it: marks appended, the end a query answers."""

    marks: list[Ending | str] = dataclasses.field(default_factory=list)  # str: a move

    def get_watermark_offsets(self, _tp: object, timeout: float = 0.0) -> tuple[int, int]:
        return 0, len(self.marks)


def _gate() -> tuple[HandOutIndex, Takeover, Ledger]:
    takeover = Takeover("chunks", "chunks.handout")
    takeover.active = False  # taken over: the gate is what is left
    return HandOutIndex(100), takeover, Ledger()


def _read_ledger(index: HandOutIndex, takeover: Takeover, ledger: Ledger, upto: int) -> None:
    """The receiver's consumer reads the ledger's marks up to offset `upto`."""
    for offset in range(takeover.ledger_read, min(upto, len(ledger.marks))):
        mark = ledger.marks[offset]
        if isinstance(mark, str):
            index.moved(mark, 0.0)
        else:
            index.ended_elsewhere(mark)
        takeover.read(offset)


def test_a_request_ended_elsewhere_is_refused_though_its_records_were_read_first() -> None:
    index, takeover, ledger = _gate()
    for chunk in range(3):
        assert index.add(_key("r", chunk), Entry(chunk, 1, 0, chunk, chunk == 2), 0.0)
    ledger.marks.append(Ending("r", 0, 2, FINISHED, 0.0, mark_offset=0))  # ended at replica 0
    # re-submitted here: the adapter asks before this receiver read the mark
    assert index.take(_key("r", 0), 1.0, takeover.synced_at) is None
    assert index.gate_since(takeover.synced_at) == 1.0
    assert not takeover.sync(ledger, 1.0, 1.5)  # the ledger's end is 1; nothing read yet
    _read_ledger(index, takeover, ledger, 1)
    assert takeover.sync(ledger, 1.0, 1.6) and takeover.synced_at == 1.5
    assert index.take(_key("r", 0), 2.0, takeover.synced_at) is None
    assert index.asked_after_end() == [("r", _key("r", 0))]  # failed with the reason


def test_a_request_nothing_ended_passes_the_gate_once_the_ledger_was_read() -> None:
    index, takeover, ledger = _gate()
    ledger.marks.append(Ending("other", 0, 9, FINISHED, 0.0, mark_offset=0))
    assert index.add(_key("r", 0), Entry("p", 1, 0, 0), 0.0)
    assert index.take(_key("r", 0), 1.0, takeover.synced_at) is None
    assert takeover.sync(ledger, index.gate_since(takeover.synced_at), 1.2) is False
    _read_ledger(index, takeover, ledger, 1)
    assert takeover.sync(ledger, index.gate_since(takeover.synced_at), 1.3)
    taken = index.take(_key("r", 0), 1.4, takeover.synced_at)
    assert taken is not None and taken.payload == "p"
    assert index.gate_since(takeover.synced_at) is None


def test_an_ask_before_any_record_and_an_own_put_are_not_held_at_the_gate() -> None:
    index, takeover, ledger = _gate()
    assert index.take(_key("early", 0), 1.0, takeover.synced_at) is None  # asked first
    assert takeover.sync(ledger, index.gate_since(takeover.synced_at), 1.1)  # empty ledger
    assert index.add(_key("early", 0), Entry("e", 1, 0, 0), 2.0)  # its record comes later
    assert index.take(_key("early", 0), 2.0, takeover.synced_at) is not None
    assert index.add(_key("mine", 0), Entry("m", 1, 0, 1), 2.0, own=True)  # this instance put it
    assert index.take(_key("mine", 0), 2.0, takeover.synced_at) is not None


def test_a_request_moved_here_after_it_ended_elsewhere_is_handed_out_from_chunk_0() -> None:
    index, takeover, ledger = _gate()
    ledger.marks.append(Ending("r", 0, 2, FINISHED, 0.0, mark_offset=0))  # ended at replica 0
    _read_ledger(index, takeover, ledger, 1)  # the mark is read before the records here
    for chunk in range(3):
        assert not index.add(_key("r", chunk), Entry(chunk, 1, 0, chunk, chunk == 2), 0.0)
    assert index.parked == 3 and len(index) == 0
    assert index.take(_key("r", 0), 1.0, takeover.synced_at) is None  # asked: moved here
    ledger.marks.append("r")  # the orchestrator wrote the move before it submitted here
    assert takeover.sync(ledger, index.gate_since(takeover.synced_at), 1.1) is False
    assert index.asked_after_end(takeover.synced_at) == []  # not refused before the gate
    _read_ledger(index, takeover, ledger, 2)
    assert takeover.sync(ledger, index.gate_since(takeover.synced_at), 1.2)
    taken = [index.take(_key("r", chunk), 2.0, takeover.synced_at) for chunk in range(3)]
    assert [e.payload for e in taken if e is not None] == [0, 1, 2]
    assert index.parked == 0 and index.asked_after_end(takeover.synced_at) == []


def test_parked_records_are_bounded_and_expire() -> None:
    index = HandOutIndex(4, idle_s=10.0)
    for n in range(3):
        index.ended_elsewhere(Ending(f"r{n}", 0, 10 * n + 1, FINISHED, 0.0, mark_offset=n))
        for chunk in range(2):
            index.add(_key(f"r{n}", chunk), Entry(chunk, 1, 0, 10 * n + chunk), 0.0)
    assert index.parked == 4 and index.counts["parked_evicted"] == 2  # r0's, the oldest
    index.expire(10.0)
    assert index.parked == 0


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.integers(1, 4),
    ended_elsewhere=st.booleans(),
    moved=st.booleans(),
    read_lag=st.lists(st.integers(0, 2), min_size=1, max_size=12),
    other_marks=st.integers(0, 3),
)
def test_whatever_the_reader_s_lag_an_ended_request_asked_after_its_mark_is_never_handed_out(
    chunks: int, ended_elsewhere: bool, moved: bool, read_lag: list[int], other_marks: int
) -> None:
    index, takeover, ledger = _gate()
    for chunk in range(chunks):
        index.add(_key("r", chunk), Entry(chunk, 1, 0, chunk, chunk == chunks - 1), 0.0)
    for n in range(other_marks):
        ledger.marks.append(Ending(f"o{n}", 1, n, FINISHED, 0.0, mark_offset=len(ledger.marks)))
    if ended_elsewhere:  # its mark is on the ledger before the adapter here asks
        ledger.marks.append(Ending("r", 0, chunks - 1, FINISHED, 0.0, mark_offset=3))
    if moved:  # and the orchestrator's move of it after the mark
        ledger.marks.append("r")
    handed: list[object] = []
    refused = False
    now, next_chunk = 1.0, 0

    def one_pass(lag: int) -> None:  # the adapter asks, the consumer reads some and syncs
        nonlocal now, next_chunk, refused
        now += 1.0
        if next_chunk == chunks:
            return  # its terminal was handed out: the adapter asks no more
        entry = index.take(_key("r", next_chunk), now, takeover.synced_at)
        if entry is not None:
            handed.append(entry.payload)
            next_chunk += 1
        refused = refused or bool(index.asked_after_end(takeover.synced_at))
        _read_ledger(index, takeover, ledger, takeover.ledger_read + lag)
        takeover.sync(ledger, index.gate_since(takeover.synced_at), now + 0.5)

    for lag in read_lag:
        one_pass(lag)
        assert handed == list(range(len(handed)))  # in order, none twice
    if ended_elsewhere and not moved:
        assert handed == []
    else:
        assert not refused
    for _ in range(chunks + 3):  # the reader catches up
        one_pass(len(ledger.marks))
    if ended_elsewhere and not moved:
        assert handed == [] and refused
    else:
        assert handed == list(range(chunks)) and not refused
