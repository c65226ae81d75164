"""Configuration checks, the request snapshot format, and the outcome values."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from codeclog.consumers.stream.fold.outcomes import (
    Decode,
    Echo,
    OutcomeKind,
    RejectReason,
)
from codeclog.consumers.stream.fold.rules import fold, new_decode
from codeclog.consumers.stream.fold.state import (
    FoldConfig,
    FoldConfigError,
    FoldStateError,
    Policy,
    export_request,
    import_request,
    new_state,
    open_requests,
)
from codeclog.errors import CodeclogError
from codeclog.schemas.records import CodecChunk


@pytest.mark.parametrize(
    "kwargs",
    [
        {"policy": "tolerant"},
        {"lookahead_frames": -1},
        {"tombstone_requests": 0},
        {"digest_ring": 0},
        {"released_epochs_kept": 0},
        {"digest_ring": True},
        {"digest_ring": 2.5},
    ],
    ids=lambda kwargs: ",".join(kwargs),
)
def test_invalid_config_is_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(FoldConfigError) as raised:
        FoldConfig(**kwargs)
    assert isinstance(raised.value, CodeclogError)


def test_stable_enum_values() -> None:
    assert [kind.value for kind in OutcomeKind] == [
        "decode",
        "hold",
        "marker",
        "release",
        "reject",
        "gap",
        "duplicate",
        "abandoned",
    ]
    values = {reason.value for reason in RejectReason}
    upstream = {
        "missing_request_id",
        "negative_stream_position",
        "missing_state_for_chunk",
        "stale_cache_epoch",
        "new_epoch_requires_first_chunk",
        "stale_or_reordered_chunk",
        "empty_nonfinal_chunk",
        "chunk_below_lookahead_window",
        "backend_unsupported_or_failed",
    }
    consumer = {"invalid_codes", "invalid_frame_count", "undecodable_record", "vocoder_failed"}
    consumer |= {"key_mismatch", "missing_key"}  # the dead-letter reasons of the pipeline
    tolerant = {"chunk_after_final", "conflicting_duplicate", "late_chunk", "aborted", "evicted"}
    tolerant |= {"stream_position_out_of_range"}
    assert upstream | consumer | tolerant == values


def test_new_decode_equals_the_dataclass_constructor() -> None:
    chunk = CodecChunk("r", (1, 2, 3, 4), llm_output_text_utf8=b"x")
    held = Echo(turn_end=True, llm_output_text_utf8=b"a")
    fast = new_decode("r", 2, (3, 4), True, (1, 2, 3, 4), chunk, held)
    assert fast == Decode("r", 2, (3, 4), 4, True, (1, 2, 3, 4), chunk, held)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.final = False  # type: ignore[misc]


def test_echo_merges_the_window() -> None:
    held = Echo(1, 2, False, True, False, b"he", 10)
    newest = CodecChunk(
        "r",
        (1,),
        duplex_epoch=3,
        duplex_turn_id=4,
        turn_end=True,
        llm_output_text_utf8=b"llo",
        produced_at_ms=20,
    )
    decode = new_decode("r", 0, (0, 1), True, (1,), newest, held)
    assert decode.echo == Echo(3, 4, True, True, False, b"hello", 20)
    assert new_decode("r", 0, (0,), True, (1,), None, held).echo == held
    assert new_decode("r", 0, (0,), True, (1,), None).echo == Echo()


def _state_with_history() -> Any:
    state = new_state()
    chunks = [
        CodecChunk("a", tuple(range(28)), chunk_seq=0),
        CodecChunk("a", (1, 2), chunk_seq=1, codec_left_context_frames=0, turn_end=True),
        CodecChunk("b", tuple(range(28)), chunk_seq=0, last_chunk=True),
    ]
    for chunk in chunks:
        state, _ = fold(state, chunk)
    return state


def test_export_is_plain_json_and_unknown_requests_export_none() -> None:
    state = _state_with_history()
    exported = export_request(state, "a")
    assert exported is not None and json.loads(json.dumps(exported)) == exported
    assert (exported["open"], exported["held_codes"], exported["held_seqs"]) == (True, [1, 2], [1])
    assert exported["held_echo"]["turn_end"] is True
    assert export_request(state, "nobody") is None
    restored = new_state()
    for rid in ("a", "b"):
        snapshot = export_request(state, rid)
        assert snapshot is not None
        import_request(restored, rid, snapshot)
        assert export_request(restored, rid) == snapshot
    assert open_requests(restored) == ["a"]


NO_DIGESTS = {"seqs": [], "values": [], "forgotten_below": 0}


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(version=99),
        lambda d: d.pop("epoch"),
        lambda d: d.update(last_seq="3"),
        lambda d: d.update(open=1),
        lambda d: d.update(held_seqs=[]),
        lambda d: d["digests"].update(seqs=[2, 1], values=[0, 0]),
        lambda d: d["digests"].update(seqs=[2**40], values=[0]),
        lambda d: d.update(open=False, released=[]),
        lambda d: d.update(
            released=[
                {"epoch": 9, "last_seq": 0, "end": "chunk_after_final", "digests": NO_DIGESTS}
            ]
        ),
        lambda d: d.update(held_echo={"duplex_epoch": 1}),
    ],
    ids=[
        "version",
        "missing key",
        "str int",
        "int bool",
        "held without seqs",
        "unsorted digests",
        "seq overflow",
        "closed without tombstone",
        "future tombstone",
        "partial echo",
    ],
)
def test_malformed_snapshots_are_refused(mutate: Any) -> None:
    state = _state_with_history()
    snapshot = export_request(state, "a")
    assert snapshot is not None
    mutate(snapshot)
    with pytest.raises(FoldStateError):
        import_request(new_state(), "a", snapshot)


def test_import_needs_a_request_id() -> None:
    snapshot = export_request(_state_with_history(), "a")
    assert snapshot is not None
    with pytest.raises(FoldStateError):
        import_request(new_state(), "", snapshot)


def test_fold_refuses_a_non_event() -> None:
    with pytest.raises(TypeError):
        fold(new_state(FoldConfig(policy=Policy.STRICT)), "not an event")  # type: ignore[arg-type]
