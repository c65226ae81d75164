"""One named case per rule of docs/fold-contract.md: the outcomes of the last event of a stream.

Each case folds `events` under `policy` and compares the report form of the outcomes of the
final event with `expect`. The rule id is the case id, so a failure names the rule it breaks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from codeclog.consumers.stream.fold.outcomes import Echo, Outcome
from codeclog.consumers.stream.fold.rules import evict, fold
from codeclog.consumers.stream.fold.state import FoldConfig, Policy, new_state, open_requests
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind

S, T = Policy.STRICT, Policy.TOLERANT
Event = CodecChunk | ControlEvent


def ck(
    seq: int = 0,
    n: int = 28,
    *,
    rid: str = "r",
    epoch: int = 0,
    lcf: int = 3,
    last: bool = False,
    tts: bool = False,
    numel: int | None = None,
    codes: tuple[int, ...] | None = None,
) -> CodecChunk:
    """A chunk of `n` ids, distinct per (epoch, seq) so that digests differ."""
    if codes is None:
        base = 100 + 1000 * epoch + 30 * seq
        codes = tuple(range(base, base + n))
    return CodecChunk(
        request_id=rid,
        codes=codes,
        cache_epoch=epoch,
        chunk_seq=seq,
        code_flat_numel=numel,
        codec_left_context_frames=lcf,
        last_chunk=last,
        tts_is_last_chunk=tts,
    )


def ctl(kind: ControlKind, rid: str = "r") -> ControlEvent:
    return ControlEvent(request_id=rid, kind=kind)


def placeholder(seq: int, *, last: bool = False, tts: bool = False, epoch: int = 0) -> CodecChunk:
    return ck(seq, codes=(0,), numel=0, lcf=0, last=last, tts=tts, epoch=epoch)


def dec(seqs: list[int], frames: int, final: bool = False, epoch: int = 0) -> dict[str, Any]:
    return {
        "kind": "decode",
        "cache_epoch": epoch,
        "chunk_seqs": seqs,
        "frames": frames,
        "final": final,
    }


def hold(seq: int, frames: int, epoch: int = 0) -> dict[str, Any]:
    return {"kind": "hold", "cache_epoch": epoch, "chunk_seq": seq, "frames": frames}


def marker(seq: int, epoch: int = 0) -> dict[str, Any]:
    return {"kind": "marker", "cache_epoch": epoch, "chunk_seq": seq}


def rel(epoch: int = 0) -> dict[str, Any]:
    return {"kind": "release", "cache_epoch": epoch}


def rej(reason: str, seq: int, epoch: int = 0, **details: Any) -> dict[str, Any]:
    return {
        "kind": "reject",
        "reason": reason,
        "cache_epoch": epoch,
        "chunk_seq": seq,
        "details": details,
    }


def gap(first: int, last: int, discarded: int = 0, epoch: int = 0) -> dict[str, Any]:
    return {
        "kind": "gap",
        "cache_epoch": epoch,
        "missing_from": first,
        "missing_to": last,
        "discarded_frames": discarded,
    }


def dup(seq: int, epoch: int = 0) -> dict[str, Any]:
    return {"kind": "duplicate", "cache_epoch": epoch, "chunk_seq": seq}


def abandoned(frames: int, epoch: int = 0) -> dict[str, Any]:
    return {"kind": "abandoned", "cache_epoch": epoch, "frames": frames}


@dataclasses.dataclass(frozen=True)
class Case:
    rule: str
    policy: Policy
    events: list[Event]
    expect: list[dict[str, Any]]


BAD_ID = 6561  # the talker's EOS: never a codec id for the vocoder
CASES = [
    # ---- strict (the upstream Code2Wav) ----
    Case("S1 missing request id", S, [ck(rid="")], [rej("missing_request_id", 0)]),
    Case("S2 negative epoch", S, [ck(epoch=-1)], [rej("negative_stream_position", 0, -1)]),
    Case("S2 negative seq", S, [ck(-1)], [rej("negative_stream_position", -1)]),
    Case(
        "S2a frame count above len(codes)",
        S,
        [ck(numel=29)],
        [
            rej(
                "backend_unsupported_or_failed",
                0,
                error_type="invalid_frame_count",
                error="invalid_frame_count: code_flat_numel=29, codes=28",
            )
        ],
    ),
    Case(
        "S2a codec id out of range",
        S,
        [ck(codes=(1, 2, 3, BAD_ID))],
        [
            rej(
                "backend_unsupported_or_failed",
                0,
                error_type="invalid_codes",
                error="invalid_codes: code=6561, index=3",
            )
        ],
    ),
    Case(
        "S3 no state and seq != 0",
        S,
        [ck(1)],
        [rej("missing_state_for_chunk", 1, request_id="r", cache_epoch=0, chunk_seq=1)],
    ),
    Case(
        "S4 stale epoch",
        S,
        [ck(0, epoch=2), ck(0, epoch=1)],
        [rej("stale_cache_epoch", 0, 1, expected=2, actual=1)],
    ),
    Case(
        "S5 newer epoch not at seq 0",
        S,
        [ck(0), ck(1, epoch=1)],
        [rej("new_epoch_requires_first_chunk", 1, 1, request_id="r", cache_epoch=1, chunk_seq=1)],
    ),
    Case(
        "S5 newer epoch at seq 0 starts fresh", S, [ck(0), ck(0, epoch=1)], [dec([0], 28, epoch=1)]
    ),
    Case(
        "S6 skipped seq",
        S,
        [ck(0), ck(2)],
        [rej("stale_or_reordered_chunk", 2, expected=1, actual=2)],
    ),
    Case(
        "S6 replayed seq",
        S,
        [ck(0), ck(0)],
        [rej("stale_or_reordered_chunk", 0, expected=1, actual=0)],
    ),
    Case("S7 terminal sentinel", S, [ck(0), placeholder(1, last=True)], [rel()]),
    Case("S7 sentinel without state", S, [placeholder(0, last=True)], [rel()]),
    Case("S8 segment marker advances", S, [ck(0), placeholder(1, tts=True), ck(2)], [dec([2], 28)]),
    Case("S8 marker creates state", S, [placeholder(0, tts=True), ck(1)], [dec([1], 28)]),
    Case(
        "S9 empty non-final",
        S,
        [placeholder(0)],
        [rej("empty_nonfinal_chunk", 0, request_ids=["r"])],
    ),
    Case(
        "S10 window below lookahead",
        S,
        [ck(0, 3, lcf=0)],
        [rej("chunk_below_lookahead_window", 0, frames=3, minimum=4)],
    ),
    Case("S10 exactly L+1 frames decode", S, [ck(0, 4, lcf=0)], [dec([0], 4)]),
    Case("S11 decode", S, [ck(0), ck(1)], [dec([1], 28)]),
    Case("S11 short final decodes", S, [ck(0), ck(1, 3, last=True)], [dec([1], 3, True), rel()]),
    # ---- tolerant (the product default) ----
    Case("T1 missing request id", T, [ck(rid="")], [rej("missing_request_id", 0)]),
    Case("T2 negative epoch", T, [ck(epoch=-1)], [rej("negative_stream_position", 0, -1)]),
    Case("T2 negative seq", T, [ck(-5)], [rej("negative_stream_position", -5)]),
    Case(
        "T2 position above int32",
        T,
        [ck(2**31)],
        [rej("stream_position_out_of_range", 2**31, maximum=2**31 - 1)],
    ),
    Case(
        "T2a frame count above len(codes)",
        T,
        [ck(numel=29)],
        [rej("invalid_frame_count", 0, code_flat_numel=29, codes=28)],
    ),
    Case(
        "T2a negative frame count",
        T,
        [ck(numel=-1)],
        [rej("invalid_frame_count", 0, code_flat_numel=-1, codes=28)],
    ),
    Case(
        "T2a codec id out of range",
        T,
        [ck(0), ck(1, codes=(5, -1, 7, 8))],
        [rej("invalid_codes", 1, index=1, code=-1)],
    ),
    Case(
        "T2a leaves no state: the next chunk sees a gap",
        T,
        [ck(0), ck(1, codes=(BAD_ID,) * 28), ck(2)],
        [gap(1, 1), dec([2], 28)],
    ),
    Case(
        "T2a does not check a placeholder's padding",
        T,
        [ck(0), ck(1, codes=(BAD_ID,), numel=0, tts=True)],
        [marker(1)],
    ),
    Case("T3 redelivery after release", T, [ck(0), ck(1, last=True), ck(0)], [dup(0)]),
    Case(
        "T3 new content after release",
        T,
        [ck(0), ck(1, last=True), ck(0, codes=(1,) * 28)],
        [rej("chunk_after_final", 0, cache_epoch=0)],
    ),
    Case(
        "T3 seq beyond the final one",
        T,
        [ck(0), ck(1, last=True), ck(2)],
        [rej("chunk_after_final", 2, cache_epoch=0)],
    ),
    Case(
        "T3 released epoch checked before T4",
        T,
        [ck(0), ck(1, last=True), ck(0, epoch=1), ck(1, last=True)],
        [dup(1)],
    ),
    Case(
        "T3a chunk of an aborted epoch",
        T,
        [ck(0), ctl(ControlKind.ABORT), ck(1)],
        [rej("aborted", 1, cache_epoch=0)],
    ),
    Case("T3a redelivery of an aborted epoch", T, [ck(0), ctl(ControlKind.ABORT), ck(0)], [dup(0)]),
    Case(
        "T4 stale epoch",
        T,
        [ck(0, epoch=2), ck(0, epoch=1)],
        [rej("stale_cache_epoch", 0, 1, expected=2, actual=1)],
    ),
    Case(
        "T4 superseded (never released) epoch",
        T,
        [ck(0), ck(0, epoch=1), ck(1)],
        [rej("stale_cache_epoch", 1, expected=1, actual=0)],
    ),
    Case("T5 new request at seq 0", T, [ck(0)], [dec([0], 28)]),
    Case("T5 new request mid-stream", T, [ck(3)], [gap(0, 2), dec([3], 28)]),
    Case(
        "T5 new epoch after release", T, [ck(0, last=True), ck(0, epoch=1)], [dec([0], 28, epoch=1)]
    ),
    Case(
        "T5 new epoch abandons held frames",
        T,
        [ck(0, 2, lcf=0), ck(0, epoch=1)],
        [abandoned(2), dec([0], 28, epoch=1)],
    ),
    Case(
        "T5 new epoch mid-stream",
        T,
        [ck(0), ck(2, epoch=1)],
        [gap(0, 1, epoch=1), dec([2], 28, epoch=1)],
    ),
    Case("T6 redelivery", T, [ck(0), ck(1), ck(0)], [dup(0)]),
    Case("T6 redelivery of a held chunk", T, [ck(0, 2, lcf=0), ck(0, 2, lcf=0)], [dup(0)]),
    Case(
        "T6 conflicting content",
        T,
        [ck(0), ck(1), ck(1, codes=(9,) * 28)],
        [rej("conflicting_duplicate", 1, chunk_seq=1)],
    ),
    Case(
        "T6 conflicting flags",
        T,
        [ck(0), ck(1), ck(1, tts=True)],
        [rej("conflicting_duplicate", 1, chunk_seq=1)],
    ),
    Case(
        "T6a chunk of a declared gap",
        T,
        [ck(0), ck(3), ck(1)],
        [rej("late_chunk", 1, chunk_seq=1)],
    ),
    Case("T7 gap", T, [ck(0), ck(3)], [gap(1, 2), dec([3], 28)]),
    Case(
        "T7 gap discards held frames",
        T,
        [ck(0, 2, lcf=0), ck(2, lcf=0)],
        [gap(1, 1, discarded=2), dec([2], 28)],
    ),
    Case("T8 next chunk", T, [ck(0), ck(1)], [dec([1], 28)]),
    Case("A1 sentinel releases", T, [ck(0), placeholder(1, last=True)], [rel()]),
    Case(
        "A1 sentinel flushes held frames",
        T,
        [ck(0, 2, lcf=0), placeholder(1, last=True)],
        [dec([0], 2, True), rel()],
    ),
    Case("A2 marker", T, [ck(0), placeholder(1, tts=True)], [marker(1)]),
    Case(
        "A2 marker keeps held frames",
        T,
        [ck(0, 2, lcf=0), placeholder(1, tts=True), ck(2, 5, lcf=2)],
        [dec([0, 2], 5)],
    ),
    Case("A3 empty non-final", T, [ck(0), placeholder(1)], [rej("empty_nonfinal_chunk", 1)]),
    Case("A3 the position still advances", T, [ck(0), placeholder(1), ck(2)], [dec([2], 28)]),
    Case("A4 short window is held", T, [ck(0, 3, lcf=0)], [hold(0, 3)]),
    Case("A4 held frames accumulate", T, [ck(0, 1, lcf=0), ck(1, 2, lcf=0)], [hold(1, 3)]),
    Case(
        "A4 merge drops the repeated context",
        T,
        [ck(0, 2, lcf=0), ck(1, 27, lcf=2)],
        [dec([0, 1], 27)],
    ),
    Case(
        "A4 left context is clamped",
        T,
        [ck(0, 2, lcf=0), ck(1, 6, lcf=99)],
        [hold(1, 2)],
    ),
    Case(
        "A4 negative left context counts as none",
        T,
        [ck(0, 2, lcf=0), ck(1, 6, lcf=-4)],
        [dec([0, 1], 8)],
    ),
    Case("A4 short final decodes", T, [ck(0, 2, lcf=0, last=True)], [dec([0], 2, True), rel()]),
    Case(
        "A4 held + final merge",
        T,
        [ck(0, 2, lcf=0), ck(1, 3, lcf=2, last=True)],
        [dec([0, 1], 3, True), rel()],
    ),
    # ---- control events ----
    Case("abort releases", T, [ck(0), ctl(ControlKind.ABORT)], [rel()]),
    Case("abort drops held frames", T, [ck(0, 2, lcf=0), ctl(ControlKind.ABORT)], [rel()]),
    Case(
        "finish flushes held frames",
        T,
        [ck(0, 2, lcf=0), ctl(ControlKind.FINISH)],
        [dec([0], 2, True), rel()],
    ),
    Case("finish without held frames", T, [ck(0), ctl(ControlKind.FINISH)], [rel()]),
    Case("control without a stream is a no-op", T, [ctl(ControlKind.FINISH)], []),
    Case(
        "repeated abort is a no-op", T, [ck(0), ctl(ControlKind.ABORT), ctl(ControlKind.ABORT)], []
    ),
    Case(
        "control without request id",
        T,
        [ctl(ControlKind.ABORT, rid="")],
        [rej("missing_request_id", -1, -1)],
    ),
    Case("strict abort releases", S, [ck(0), ctl(ControlKind.ABORT)], [rel()]),
    Case("strict finish releases", S, [ck(0), ctl(ControlKind.FINISH)], [rel()]),
]


def last_outcomes(policy: Policy, events: list[Event]) -> list[Outcome]:
    state = new_state(FoldConfig(policy=policy))
    outcomes: list[Outcome] = []
    for event in events:
        state, outcomes = fold(state, event)
    return outcomes


@pytest.mark.parametrize("case", CASES, ids=[case.rule for case in CASES])
def test_rule(case: Case) -> None:
    outcomes = last_outcomes(case.policy, case.events)
    assert [outcome.to_report() for outcome in outcomes] == case.expect
    assert all(outcome.request_id == case.events[-1].request_id for outcome in outcomes)


def test_every_rule_id_has_a_case() -> None:
    covered = {case.rule.split()[0] for case in CASES}
    wanted = {f"S{i}" for i in range(1, 12)} | {f"T{i}" for i in range(1, 9)}
    wanted |= {"A1", "A2", "A3", "A4", "S2a", "T2a", "T3a", "T6a", "abort", "finish"}
    assert wanted <= covered


@pytest.mark.parametrize(
    ("events", "unprocessed"),
    [
        ([ck(1), ck(0), ck(1)], 2),
        ([ck(0), ck(0), ctl(ControlKind.ABORT)], 1),
        ([ctl(ControlKind.FINISH, rid="")], 0),
    ],
    ids=["after S3", "after S6", "control without id"],
)
def test_strict_first_rejection_is_fatal(events: list[Event], unprocessed: int) -> None:
    state = new_state(FoldConfig(policy=S))
    tail: list[Outcome] = []
    for event in events:
        state, out = fold(state, event)
        if state.fatal is not None and not tail:
            tail = out
    assert state.fatal is not None and tail == [state.fatal]
    assert state.unprocessed == unprocessed
    assert state.events == len(events) - unprocessed


def test_strict_fatal_kills_every_open_stream() -> None:
    state = new_state(FoldConfig(policy=S))
    for event in [ck(0, rid="a"), ck(0, rid="b"), ck(1, rid="b", last=True), ck(5, rid="c")]:
        state, _ = fold(state, event)
    assert state.killed == ("a", "c")


def test_tolerant_is_never_fatal() -> None:
    state = new_state(FoldConfig(policy=T))
    for event in [ck(1), ck(rid=""), ck(0, 2, lcf=0, epoch=-1), ck(2)]:
        state, _ = fold(state, event)
    assert state.fatal is None and state.unprocessed == 0 and state.events == 4


@pytest.mark.parametrize("policy", [S, T])
def test_evict_rejects_and_releases(policy: Policy) -> None:
    state = new_state(FoldConfig(policy=policy))
    state, _ = fold(state, ck(0))
    state, _ = fold(state, ck(1))
    outcomes = evict(state, "r")
    assert [o.to_report() for o in outcomes] == [rej("evicted", 1, held_frames=0), rel()]
    assert open_requests(state) == [] and state.fatal is None
    assert evict(state, "r") == []


def test_evicted_epoch_rejects_late_chunks() -> None:
    state = new_state()
    state, _ = fold(state, ck(0, 2, lcf=0))
    first = evict(state, "r")[0]
    assert first.to_report()["details"] == {"held_frames": 2}
    _, outcomes = fold(state, ck(1))
    assert [o.to_report() for o in outcomes] == [rej("evicted", 1, cache_epoch=0)]


def test_decode_carries_the_window_ids() -> None:
    outcomes = last_outcomes(
        T, [ck(0, 2, lcf=0, codes=(7, 8)), ck(1, lcf=2, codes=(7, 8, 9, 10, 11))]
    )
    decode = outcomes[0]
    assert decode.to_report()["kind"] == "decode"
    assert getattr(decode, "codes", None) == (7, 8, 9, 10, 11)


def _outcomes_with(config: FoldConfig, events: list[Event]) -> list[list[dict[str, Any]]]:
    state = new_state(config)
    result = []
    for event in events:
        state, outcomes = fold(state, event)
        result.append([outcome.to_report() for outcome in outcomes])
    return result


def test_a_redelivery_older_than_the_digest_ring_is_a_duplicate_without_verification() -> None:
    """Digests and their bound: past `digest_ring` applied chunks a redelivery cannot be
    verified and is `duplicate` (T6 open, T3 released), even with other content: never
    decoded. Within the ring a conflict is still refused."""
    other = (9, 9, 9, 9, 9)
    ring = FoldConfig(digest_ring=2)
    opened = [ck(0), ck(1), ck(2), ck(3)]  # the ring holds seqs 2 and 3
    *_, same, conflict, recent = _outcomes_with(
        ring, [*opened, ck(0), ck(1, codes=other), ck(3, codes=other)]
    )
    assert (same, conflict) == ([dup(0)], [dup(1)])
    assert recent == [rej("conflicting_duplicate", 3, chunk_seq=3)]
    released = [*opened, ck(4, last=True)]
    *_, same, conflict = _outcomes_with(ring, [*released, ck(0), ck(1, codes=other)])
    assert (same, conflict) == ([dup(0)], [dup(1)])


def test_a_merged_window_echoes_the_newest_ids_every_flag_and_the_whole_text() -> None:
    """The decode echo: duplex ids and clock of the newest chunk in the window, turn_end,
    tts_is_last_chunk and segment_end OR-ed over its chunks, the texts concatenated in order;
    a finish flush echoes the held chunks only."""

    def chunk(seq: int, n: int, flag: str, text: bytes) -> CodecChunk:
        flags = {"turn_end": False, "tts_is_last_chunk": False, "segment_end": False, flag: True}
        return dataclasses.replace(
            ck(seq, n, lcf=0),
            duplex_epoch=seq + 1,
            duplex_turn_id=10 + seq,
            llm_output_text_utf8=text,
            produced_at_ms=100 * (seq + 1),
            **flags,
        )

    first, second = chunk(0, 1, "turn_end", b"a"), chunk(1, 1, "tts_is_last_chunk", b"b")
    held = [first, second]  # 1 + 1 frames: both held
    decode = last_outcomes(T, [*held, chunk(2, 3, "segment_end", b"c")])[0]
    assert getattr(decode, "echo", None) == Echo(3, 12, True, True, True, b"abc", 300)
    flushed = last_outcomes(T, [*held, ctl(ControlKind.FINISH)])[0]
    assert getattr(flushed, "echo", None) == Echo(2, 11, True, True, False, b"ab", 200)
