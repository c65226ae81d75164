"""The connector receiver's index (omni.index), without Kafka: each key is handed out once, and
nothing of a request is kept once it ended."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.omni.index import (
    FINISHED,
    TIMED_OUT,
    Ending,
    Entry,
    HandOutIndex,
    IndexKey,
    request_of,
)

KEY: IndexKey = ("req_a_1_0", "1", "2")


def _entry(offset: int, payload: object = "p", terminal: bool = False) -> Entry:
    return Entry(payload, 10, 0, offset, terminal)


def test_a_copy_that_arrives_after_the_key_was_handed_out_is_dropped_and_counted() -> None:
    index = HandOutIndex(100)
    assert index.add(KEY, _entry(0, "first"), 0.0)
    taken = index.take(KEY, 0.0)
    assert taken is not None and taken.payload == "first"
    index.read(0, 0)
    assert not index.add(KEY, _entry(1, "copy"), 0.0)  # a producer retry that landed twice
    index.read(0, 1)
    assert index.take(KEY, 0.0) is None
    assert len(index) == 0 and index.counts["redelivered"] == 1 and index.counts["gets"] == 1
    # req_a has not ended: a successor re-reads it from its first record (and drops the copy)
    assert index.commit_offsets() == {0: 0}


def test_a_copy_that_arrives_while_the_key_waits_is_dropped() -> None:
    index = HandOutIndex(100)
    assert index.add(KEY, _entry(0, "first"), 0.0)
    assert not index.add(KEY, _entry(1, "copy"), 0.0)
    assert not index.add(KEY, _entry(0, "first"), 0.0)  # the same record read again: silent
    taken = index.take(KEY, 0.0)
    assert taken is not None and taken.payload == "first"
    assert index.counts["redelivered"] == 1


def test_forget_ends_a_request_and_only_that_request() -> None:
    index = HandOutIndex(100)
    other: IndexKey = ("req_b_1_0", "1", "2")
    for key in (KEY, other):
        assert index.add(key, _entry(0), 0.0)
        assert index.take(key, 0.0) is not None
    index.forget("req_a", 0.0)
    assert index.add(KEY, _entry(5), 0.0)  # a new request under the same id after cleanup
    assert not index.add(other, _entry(6), 0.0)


# A sequence of operations on a few keys: ("add", key number), ("take", key), ("forget", request)
OPS = st.lists(
    st.tuples(st.sampled_from(["add", "take", "forget"]), st.integers(0, 3)), max_size=60
)


def _key(number: int) -> IndexKey:
    return (f"r{number % 2}_1_{number}", "1", "2")  # two requests, two keys each


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_every_key_is_handed_out_at_most_once_between_cleanups(ops: list[tuple[str, int]]) -> None:
    index = HandOutIndex(100)
    handed: dict[IndexKey, int] = {}
    refused = 0  # copies, and keys of a request after its cleanup (late)
    for offset, (op, number) in enumerate(ops):
        key = _key(number)
        if op == "add":
            refused += not index.add(key, Entry(offset, 1, 0, offset), 0.0)
        elif op == "take":
            if index.take(key, 0.0) is not None:
                handed[key] = handed.get(key, 0) + 1
        else:
            index.forget(f"r{number % 2}", 0.0)
            handed = {k: n for k, n in handed.items() if request_of(k) != f"r{number % 2}"}
        assert all(n == 1 for n in handed.values())
    assert index.counts["redelivered"] + index.counts["late_dropped"] == refused


def test_the_commit_offset_stays_at_the_first_record_of_a_request_until_it_ends() -> None:
    """A request handed out in part is read again from its first record by a successor,
    which hands it out from chunk 0 (the adapter of a new process asks from chunk 0)."""
    index = HandOutIndex(100)
    keys: list[IndexKey] = [(f"w_1_{n}", "1", "2") for n in range(3)]
    index.read(0, 0)
    assert index.add(("v_1_0", "1", "2"), _entry(0, terminal=True), 0.0)  # another request
    for offset, key in enumerate(keys, start=1):
        index.read(0, offset)
        assert index.add(key, _entry(offset, terminal=key == keys[-1]), 0.0)
    index.read(1, 4)  # another partition, nothing of any request there
    assert index.commit_offsets() == {0: 0, 1: 5}
    assert index.take(("v_1_0", "1", "2"), 0.0) is not None  # v ended
    assert index.commit_offsets() == {0: 1, 1: 5}
    assert index.take(keys[0], 0.0) is not None and index.take(keys[1], 0.0) is not None
    assert index.commit_offsets() == {0: 1, 1: 5}  # w is handed out in part: held at its start
    assert index.take(keys[2], 0.0) is not None
    assert index.commit_offsets() == {0: 4, 1: 5}


def test_an_evicted_entry_s_request_holds_the_commit_offset_until_it_ends() -> None:
    index = HandOutIndex(1)
    for offset, key in enumerate([KEY, ("req_a_1_1", "1", "2")]):
        index.read(0, offset)
        assert index.add(key, _entry(offset), 0.0)
    assert index.counts["evicted"] == 1 and index.take(KEY, 0.0) is None
    assert index.commit_offsets() == {0: 0}
    index.forget("req_a", 1.0)
    assert index.commit_offsets() == {0: 2}


def test_handing_out_the_terminal_entry_ends_the_request() -> None:
    index = HandOutIndex(100)
    keys: list[IndexKey] = [(f"req_a_1_{n}", "1", "2") for n in range(3)]
    for offset, key in enumerate(keys):
        assert index.add(key, _entry(offset, terminal=offset == 2), 0.0)
    assert index.take(keys[0], 0.0) is not None and index.take(keys[1], 0.0) is not None
    assert index.requests == 1 and index.handed == 2
    assert index.take(keys[2], 0.0) is not None
    assert (index.requests, index.handed, len(index)) == (0, 0, 0)
    assert index.counts["finished"] == 1


def test_a_request_nobody_asks_for_is_dropped_after_the_idle_time() -> None:
    index = HandOutIndex(100, idle_s=10.0)
    assert index.add(KEY, _entry(0), 0.0)  # e.g. a request routed to another replica
    assert index.add(("req_b_1_0", "1", "2"), _entry(1), 5.0)
    index.expire(9.0)
    assert index.requests == 2
    index.expire(10.0)
    assert index.requests == 1 and len(index) == 1 and index.counts["expired"] == 1
    index.read(0, 1)
    assert index.commit_offsets() == {0: 1}  # only req_b's entry holds the commit offset


def test_forget_takes_a_request_id_or_one_put_key() -> None:
    index = HandOutIndex(100)
    keys: list[IndexKey] = [(f"req_a_1_{n}", "1", "2") for n in range(2)]
    for offset, key in enumerate(keys):
        assert index.add(key, _entry(offset), 0.0)
    index.forget("req_a_1_0", 0.0)  # vllm-omni 0.30's shared-memory form: the exact put key
    assert index.take(keys[0], 0.0) is None and len(index) == 1
    index.forget("req_a", 0.0)
    assert (index.requests, len(index)) == (0, 0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=40))
def test_nothing_is_kept_of_requests_that_ended(lengths: list[int]) -> None:
    """Requests of any lengths, interleaved, each handed out up to its terminal entry."""
    index = HandOutIndex(10_000)
    keys = {
        r: [(f"q{r}_1_{n}", "1", "2") for n in range(length)] for r, length in enumerate(lengths)
    }
    offset = 0
    for n in range(max(lengths)):
        for r, request_keys in keys.items():
            if n < len(request_keys):
                index.read(0, offset)
                assert index.add(request_keys[n], _entry(offset, terminal=n == lengths[r] - 1), 0.0)
                offset += 1
    for request_keys in keys.values():
        for key in request_keys:
            assert index.take(key, 0.0) is not None
    assert (index.requests, index.handed, len(index)) == (0, 0, 0)
    assert index.commit_offsets() == {0: offset}


def test_a_request_is_overdue_once_its_asked_chunk_has_not_come_for_the_wait() -> None:
    index = HandOutIndex(100)
    first, second = ("t_1_0", "1", "2"), ("t_1_1", "1", "2")
    assert index.take(first, 0.0) is None  # asked before anything of it was read
    assert index.overdue(4.9, 5.0) == [] and index.overdue(5.0, 5.0) == ["t"]
    assert index.add(first, _entry(0), 6.0)  # the asked chunk arrives: the wait is over
    assert index.overdue(20.0, 5.0) == []
    assert index.take(first, 7.0) is not None and index.take(second, 8.0) is None
    assert index.add(("t_1_2", "1", "2"), _entry(1), 9.0)  # another chunk is not the one asked
    assert index.overdue(12.9, 5.0) == [] and index.overdue(13.0, 5.0) == ["t"]
    assert index.asked_key("t") == second
    index.restart_waits(20.0)
    assert index.overdue(24.0, 5.0) == [] and index.overdue(25.0, 0.0) == []  # 0: no bound


def test_a_late_chunk_of_an_ended_request_is_dropped_and_chunk_0_opens_a_new_one() -> None:
    index = HandOutIndex(100)
    assert index.add(KEY, _entry(0), 0.0)
    index.end("req_a", TIMED_OUT, 1.0)
    assert [e.request_id for e in index.marks_due] == ["req_a"]
    assert not index.add(KEY, _entry(0), 2.0)  # read again: skipped
    assert not index.add(("req_a_1_1", "1", "2"), _entry(1), 2.0)  # late: dropped
    assert index.counts["late_dropped"] == 1 and index.counts["ended_skipped"] == 1
    assert index.take(("req_a_1_1", "1", "2"), 3.0) is None
    assert index.asked_after_end() == [("req_a", ("req_a_1_1", "1", "2"))]
    assert index.add(("req_a_1_0", "1", "2"), _entry(2, "again"), 4.0)  # a new request, same id
    taken = index.take(("req_a_1_0", "1", "2"), 4.0)
    assert taken is not None and taken.payload == "again"


def test_a_restored_ending_keeps_the_request_from_being_indexed_or_handed_out() -> None:
    index = HandOutIndex(100)
    assert index.take(KEY, 0.0) is None  # the new adapter asks before the ledger is read
    index.restore(Ending("req_a", 0, 3, FINISHED, 0.0, mark_offset=9))
    assert index.requests == 0 and index.asked_after_end() == [("req_a", KEY)]
    for offset in range(4):
        assert not index.add((f"req_a_1_{offset}", "1", "2"), _entry(offset), 1.0)
    assert index.ledger_floor(20, 0.0) == 9  # its records may be read again: its mark is needed
    index.read(0, 3)
    assert index.ledger_floor(20, 599.0) == 9  # ended within idle_s: a re-submission is refused
    assert index.ledger_floor(20, 600.0) == 20


def test_another_replica_s_ending_drops_what_waits_unasked_only() -> None:
    index = HandOutIndex(100)
    mine, theirs = ("m_1_0", "1", "2"), ("o_1_0", "1", "2")
    assert index.add(mine, _entry(0), 0.0) and index.add(theirs, _entry(1), 0.0)
    assert index.take(mine, 0.0) is not None  # routed here
    index.ended_elsewhere(Ending("m", 0, 0, FINISHED, 0.0, mark_offset=1))
    index.ended_elsewhere(Ending("o", 0, 1, FINISHED, 0.0, mark_offset=2))
    assert index.requests == 1 and len(index) == 0 and index.counts["ended_elsewhere"] == 1
    assert not index.add(("o_1_1", "1", "2"), _entry(2), 0.0)  # the rest of it is dropped too
