"""The memory bounds of docs/fold-contract.md, "Memory per request", hold (tracemalloc).

Each bound is the documented figure plus 25 % headroom for allocator and interpreter variation;
the point is to catch a change that makes per-request state grow, not to pin bytes.
"""

from __future__ import annotations

import tracemalloc

import pytest

from codeclog.consumers.stream.fold.rules import fold
from codeclog.consumers.stream.fold.state import (
    KEY_BYTES,
    FoldConfig,
    FoldState,
    Policy,
    new_state,
    remembered_requests,
    state_bytes,
)
from codeclog.schemas.records import CodecChunk

REQUESTS = 300
CODES = tuple(range(100, 128))


def stream(rid: str, chunks: int, epochs: int, last: bool) -> list[CodecChunk]:
    return [
        CodecChunk(
            rid, CODES, cache_epoch=epoch, chunk_seq=seq, last_chunk=last and seq == chunks - 1
        )
        for epoch in range(epochs)
        for seq in range(chunks)
    ]


def bytes_per_request(policy: Policy, chunks: int, epochs: int, last: bool) -> float:
    return measured(policy, chunks, epochs, last)[0]


def measured(policy: Policy, chunks: int, epochs: int, last: bool) -> tuple[float, FoldState]:
    """Bytes per request (tracemalloc; the request ids, allocated before, not counted) and the
    state they are in."""
    streams = [stream(f"request-{i:05d}", chunks, epochs, last) for i in range(REQUESTS)]
    state = new_state(FoldConfig(policy=policy))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for events in streams:
            for event in events:
                state, outcomes = fold(state, event)
        del outcomes
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return grown / REQUESTS, state


SHAPES = [
    (Policy.TOLERANT, 30, 1, False),
    (Policy.TOLERANT, 400, 1, False),
    (Policy.TOLERANT, 1, 1, True),
    (Policy.TOLERANT, 30, 1, True),
    (Policy.TOLERANT, 30, 3, True),
    (Policy.STRICT, 30, 1, False),
]


@pytest.mark.parametrize(("policy", "chunks", "epochs", "last"), SHAPES)
def test_the_estimate_of_a_states_bytes_is_within_a_quarter_of_what_it_holds(
    policy: Policy, chunks: int, epochs: int, last: bool
) -> None:
    """`state_bytes` (what the member exports as codeclog_vocoder_fold_state_bytes) against
    tracemalloc: the estimate less the request ids' own bytes, per request."""
    held, state = measured(policy, chunks, epochs, last)
    keys = sum(KEY_BYTES + len(rid) for rid in [*state.open, *state.closed])
    estimate = (state_bytes(state) - keys) / REQUESTS
    assert remembered_requests(state) == REQUESTS
    assert abs(estimate - held) <= 0.25 * held, f"{estimate:.0f} B estimated, {held:.0f} B held"


@pytest.mark.parametrize(
    ("policy", "chunks", "epochs", "last", "documented"),
    [
        (Policy.TOLERANT, 30, 1, False, 900),
        (Policy.TOLERANT, 400, 1, False, 3700),  # the digest ring caps it
        (Policy.TOLERANT, 30, 1, True, 1200),
        (Policy.TOLERANT, 30, 3, True, 1900),  # two tombstones kept
        (Policy.STRICT, 30, 1, False, 300),
        (Policy.STRICT, 30, 1, True, 0),
    ],
    ids=["open 30", "open 400", "released 30", "released 3x30", "strict open", "strict released"],
)
def test_bytes_per_request(
    policy: Policy, chunks: int, epochs: int, last: bool, documented: int
) -> None:
    measured = bytes_per_request(policy, chunks, epochs, last)
    assert measured <= documented * 1.25 + 64, f"{measured:.0f} B per request"
