"""Property tests for the invariants of docs/fold-contract.md.

Valid streams come from codeclog.testing.upstream_streams, an independent model of the upstream
producer's windowing (25 new + 3 context ids, a 3x4218 pre-roll, exact-boundary and short finals,
`[0]` placeholders), with the shape itself drawn so that short first windows (holds) happen too.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codeclog.consumers.stream.fold.outcomes import Decode, Outcome
from codeclog.consumers.stream.fold.report import ReportBuilder
from codeclog.consumers.stream.fold.rules import fold
from codeclog.consumers.stream.fold.state import FoldConfig, Policy, new_state, open_requests
from codeclog.schemas.records import CodecChunk, ControlEvent
from codeclog.testing.upstream_streams import StreamShape, encode_stream, interleave
from tests.fold.restore import restore
from tests.schemas.strategies import Draws, records_of

Event = CodecChunk | ControlEvent
PROPERTY_SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
REPORT_KEYS = {
    "decode": {"kind", "cache_epoch", "chunk_seqs", "frames", "final"},
    "hold": {"kind", "cache_epoch", "chunk_seq", "frames"},
    "marker": {"kind", "cache_epoch", "chunk_seq"},
    "release": {"kind", "cache_epoch"},
    "reject": {"kind", "reason", "cache_epoch", "chunk_seq", "details"},
    "gap": {"kind", "cache_epoch", "missing_from", "missing_to", "discarded_frames"},
    "duplicate": {"kind", "cache_epoch", "chunk_seq"},
    "abandoned": {"kind", "cache_epoch", "frames"},
}

# ---- arbitrary events: any ints (small ones collide, so the state machine is exercised) ----
any_int = st.one_of(st.integers(-2, 5), st.integers())
request_ids = st.one_of(st.sampled_from(["a", "b", ""]), st.text(max_size=4))
ARBITRARY = Draws(
    int32=any_int,
    int64=any_int,
    text=st.text(max_size=4),
    blob=st.binary(max_size=8),
    request_ids=request_ids,
    codes=st.lists(st.one_of(st.integers(0, 6560), st.integers()), max_size=32).map(tuple),
)
arbitrary_chunks = records_of(CodecChunk, ARBITRARY)
arbitrary_controls = records_of(ControlEvent, ARBITRARY)
arbitrary_events = st.lists(st.one_of(arbitrary_chunks, arbitrary_controls), max_size=40)
policies = st.sampled_from(Policy)

# ---- valid, upstream-like streams ----
shapes = st.builds(
    StreamShape,
    chunk_frames=st.integers(1, 25),
    left_context_frames=st.integers(0, 3),
    initial_frames=st.integers(1, 25),
    preroll=st.booleans(),
    min_unit_frames=st.integers(0, 5),
)
units = st.lists(st.lists(st.integers(0, 6560), max_size=60), min_size=1, max_size=4)


@st.composite
def sessions(draw: st.DrawFn, request_id: str = "r") -> tuple[list[CodecChunk], list[list[int]]]:
    """A session of 1-3 turns (epochs) and, per turn, the ids the talker produced in order."""
    shape = draw(shapes)
    chunks: list[CodecChunk] = []
    spoken: list[list[int]] = []
    for turn in range(draw(st.integers(1, 3))):
        turn_units = draw(units)
        chunks += encode_stream(request_id, turn_units, turn, shape, duplex_turn_id=turn)
        spoken.append([code for unit in turn_units for code in unit])
    return chunks, spoken


def fold_all(events: Sequence[Event], config: FoldConfig | None = None) -> list[list[Outcome]]:
    state = new_state(config or FoldConfig())
    per_event = []
    for event in events:
        state, outcomes = fold(state, event)
        per_event.append(outcomes)
    return per_event


def decodes(per_event: list[list[Outcome]]) -> list[tuple[Any, ...]]:
    return [
        (o.request_id, o.cache_epoch, o.chunk_seqs, o.final, o.codes, o.echo)
        for outcomes in per_event
        for o in outcomes
        if isinstance(o, Decode)
    ]


@PROPERTY_SETTINGS
@given(events=arbitrary_events, policy=policies)
def test_fold_never_raises_and_reports_cleanly(events: list[Event], policy: Policy) -> None:
    state = new_state(FoldConfig(policy=policy))
    for event in events:
        fatal_before = state.fatal is not None
        state, outcomes = fold(state, event)
        if fatal_before:
            assert outcomes == []
        for outcome in outcomes:
            assert outcome.request_id == event.request_id
            report = outcome.to_report()
            assert set(report) == REPORT_KEYS[report["kind"]]
            json.dumps(report)
            if isinstance(outcome, Decode):
                assert outcome.frames == len(outcome.codes) and all(
                    0 <= c <= 6560 for c in outcome.codes
                )
                assert outcome.echo is not None
    assert state.events + state.unprocessed == len(events)


@PROPERTY_SETTINGS
@given(events=arbitrary_events, policy=policies)
def test_report_status_agrees_with_the_fold_state(events: list[Event], policy: Policy) -> None:
    state = new_state(FoldConfig(policy=policy))
    builder = ReportBuilder(policy)
    for event in events:
        state, outcomes = fold(state, event)
        builder.add(event, outcomes)
    report = builder.result()
    status = {rid: entry["status"] for rid, entry in report["requests"].items()}
    if state.fatal is None:
        assert {rid for rid, s in status.items() if s == "open"} == set(open_requests(state))
    else:
        assert {rid for rid, s in status.items() if s == "killed"} == set(state.killed)
    assert report["events"] == state.events and report["unprocessed"] == state.unprocessed


@PROPERTY_SETTINGS
@given(session=sessions(), data=st.data())
def test_redelivering_prefixes_changes_no_decode(
    session: tuple[list[CodecChunk], list[list[int]]], data: st.DataObject
) -> None:
    chunks, _ = session
    delivered: list[CodecChunk] = []
    for index, chunk in enumerate(chunks):
        delivered.append(chunk)
        if data.draw(st.booleans()):  # a consumer restart replays from an earlier offset
            start = data.draw(st.integers(0, index))
            delivered += chunks[start : index + 1] * data.draw(st.integers(1, 3))
    assert decodes(fold_all(delivered)) == decodes(fold_all(chunks))


@PROPERTY_SETTINGS
@given(session=sessions())
def test_every_frame_is_decoded_exactly_once_in_order(
    session: tuple[list[CodecChunk], list[list[int]]],
) -> None:
    chunks, spoken = session
    context_of = {(c.cache_epoch, c.chunk_seq): c.codec_left_context_frames for c in chunks}
    decoded: dict[int, list[int]] = {epoch: [] for epoch in range(len(spoken))}
    for _, epoch, seqs, _, codes, _ in decodes(fold_all(chunks)):
        decoded[epoch] += codes[context_of[(epoch, seqs[0])] :]
    assert decoded == dict(enumerate(spoken))
    new_sent = sum(c.codec_chunk_frames for c in chunks)
    assert sum(len(ids) for ids in decoded.values()) == new_sent


@PROPERTY_SETTINGS
@given(
    streams=st.lists(sessions(), min_size=2, max_size=3),
    seed=st.integers(0, 2**32 - 1),
)
def test_outcomes_do_not_depend_on_interleaving(
    streams: list[tuple[list[CodecChunk], list[list[int]]]], seed: int
) -> None:
    """Tolerant only: under strict, one stream's rejection kills the others by design."""
    policy = Policy.TOLERANT
    renamed = [
        [CodecChunk(**{**_fields(c), "request_id": f"req-{i}"}) for c in chunks]
        for i, (chunks, _) in enumerate(streams)
    ]
    merged = interleave(random.Random(seed), renamed)
    together = _by_request(merged, fold_all(merged, FoldConfig(policy=policy)))
    for stream in renamed:
        alone = _by_request(stream, fold_all(stream, FoldConfig(policy=policy)))
        assert together[stream[0].request_id] == alone[stream[0].request_id]


def _fields(chunk: CodecChunk) -> dict[str, Any]:
    return {name: getattr(chunk, name) for name in CodecChunk.__dataclass_fields__}


def _by_request(events: Sequence[Event], per_event: list[list[Outcome]]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for event, outcomes in zip(events, per_event, strict=True):
        out.setdefault(event.request_id, []).extend(outcomes)
    return out


@PROPERTY_SETTINGS
@given(streams=st.lists(sessions(), min_size=1, max_size=6), seed=st.integers(0, 2**32 - 1))
def test_tombstones_and_digests_stay_within_their_bounds(
    streams: list[tuple[list[CodecChunk], list[list[int]]]], seed: int
) -> None:
    config = FoldConfig(tombstone_requests=2, digest_ring=3, released_epochs_kept=1)
    renamed = [
        [CodecChunk(**{**_fields(c), "request_id": f"req-{i}"}) for c in chunks]
        for i, (chunks, _) in enumerate(streams)
    ]
    events = interleave(random.Random(seed), renamed)
    events += events[: len(events) // 2]  # late redeliveries too
    state = new_state(config)
    for event in events:
        state, _ = fold(state, event)
        assert len(state.closed) <= config.tombstone_requests
        for req in [*state.open.values(), *state.closed.values()]:
            assert len(req.released) <= config.released_epochs_kept
            assert len(req.digests.seqs) <= config.digest_ring
            assert all(len(t.digests.seqs) <= config.digest_ring for t in req.released.values())


@PROPERTY_SETTINGS
@given(
    streams=st.lists(sessions(), min_size=1, max_size=3),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_export_import_continues_identically(
    streams: list[tuple[list[CodecChunk], list[list[int]]]], seed: int, data: st.DataObject
) -> None:
    renamed = [
        [CodecChunk(**{**_fields(c), "request_id": f"req-{i}"}) for c in chunks]
        for i, (chunks, _) in enumerate(streams)
    ]
    events = interleave(random.Random(seed), renamed)
    cut = data.draw(st.integers(0, len(events)))
    rest = events[cut:] + events[max(0, cut - 5) : cut]  # and some redeliveries after the cut
    original = new_state()
    for event in events[:cut]:
        original, _ = fold(original, event)
    restored = restore(original, {event.request_id for event in events}, into=new_state())
    assert sorted(open_requests(restored)) == sorted(open_requests(original))
    for event in rest:
        original, expected = fold(original, event)
        restored, got = fold(restored, event)
        assert got == expected
