"""Regression tests named after the incident codeclog exists for (docs: seed-incident.md).

vllm-omni #7978 and #7979: the admitting codec chunk lost its metadata, the upstream Code2Wav
raised, and stage 2 died for every session. The reviewer's P2 rule: a withheld first window must
still record its position.
"""

from __future__ import annotations

from typing import Any

from codeclog.consumers.stream.fold.outcomes import Decode, Outcome, Reject
from codeclog.consumers.stream.fold.report import build_report, strict_error_json
from codeclog.consumers.stream.fold.rules import fold
from codeclog.consumers.stream.fold.state import FoldConfig, Policy, new_state
from codeclog.schemas.records import SILENCE_CODE, CodecChunk

PREROLL = (SILENCE_CODE,) * 3


def window(
    seq: int, new: tuple[int, ...], context: tuple[int, ...] = PREROLL, **kw: Any
) -> CodecChunk:
    codes = context + new
    return CodecChunk(
        request_id=kw.pop("request_id", "r"),
        codes=codes,
        chunk_seq=seq,
        code_flat_numel=len(codes),
        codec_chunk_frames=len(new),
        codec_left_context_frames=len(context),
        **kw,
    )


def run(policy: Policy, events: list[CodecChunk]) -> list[list[Outcome]]:
    state = new_state(FoldConfig(policy=policy))
    per_event = []
    for event in events:
        state, outcomes = fold(state, event)
        per_event.append(outcomes)
    return per_event


BODY = tuple(range(300, 325))
TAIL = tuple(range(325, 330))


def test_7978_placeholder_stripped_strict_reproduces_the_upstream_error() -> None:
    stripped = CodecChunk(request_id="b", codes=(0,))  # the boundary lost code_flat_numel == 0
    (reject,) = run(Policy.STRICT, [stripped])[0]
    assert isinstance(reject, Reject)
    expected = '{"frames":1,"minimum":4,"reason":"chunk_below_lookahead_window"}'
    assert strict_error_json(reject) == expected


def test_7978_placeholder_stripped_tolerant_holds_it_and_keeps_the_stage() -> None:
    stripped = CodecChunk(request_id="b", codes=(0,))
    events = [
        stripped,
        window(1, BODY, request_id="b"),
        window(2, TAIL, BODY[-3:], request_id="b", last_chunk=True),
    ]
    report = build_report(events, FoldConfig(policy=Policy.TOLERANT))
    assert report["stage"]["fatal"] is None
    kinds = [o["kind"] for o in report["requests"]["b"]["outcomes"]]
    assert kinds == ["hold", "decode", "decode", "release"]


def test_7978_placeholder_with_metadata_is_a_marker_under_both_policies() -> None:
    boundary = CodecChunk(
        request_id="r", codes=(0,), chunk_seq=1, code_flat_numel=0, tts_is_last_chunk=True
    )
    for policy in Policy:
        outcomes = run(policy, [window(0, BODY), boundary, window(2, TAIL, BODY[-3:])])
        assert [o.to_report()["kind"] for o in outcomes[1]] == ["marker"]
        assert [o.to_report()["kind"] for o in outcomes[2]] == ["decode"]


def test_7979_admitting_chunk_lost_kills_strict_and_costs_tolerant_one_window() -> None:
    first_turn = [window(0, BODY), window(1, TAIL, BODY[-3:], last_chunk=True)]
    second = tuple(range(500, 525))  # the next turn's first window, epoch 1 / seq 0 ...
    lost = CodecChunk(request_id="r", codes=PREROLL + second)  # ... lost its labels
    next_chunk = window(1, TAIL, second[-3:], cache_epoch=1)
    strict = build_report([*first_turn, lost, next_chunk], FoldConfig(policy=Policy.STRICT))
    assert strict["stage"]["fatal"]["reason"] == "new_epoch_requires_first_chunk"
    tolerant = build_report([*first_turn, lost, next_chunk], FoldConfig(policy=Policy.TOLERANT))
    outcomes = tolerant["requests"]["r"]["outcomes"]
    assert tolerant["stage"]["fatal"] is None
    assert outcomes[3]["reason"] == "chunk_after_final"  # the mislabelled chunk is refused
    assert [o["kind"] for o in outcomes[4:]] == ["gap", "decode"]  # the turn goes on


def test_p2_replayed_withheld_first_window_is_not_appended_twice() -> None:
    short = window(0, (11, 12), ())
    outcomes = run(Policy.TOLERANT, [short, short, window(1, BODY, (11, 12))])
    assert [o.to_report()["kind"] for o in outcomes[1]] == ["duplicate"]
    (decode,) = outcomes[2]
    assert isinstance(decode, Decode) and decode.codes == (11, 12, *BODY)


def test_p2_new_epoch_does_not_mix_old_held_frames_in() -> None:
    outcomes = run(Policy.TOLERANT, [window(0, (11, 12), ()), window(0, BODY, cache_epoch=1)])
    abandoned, decode = outcomes[1]
    assert abandoned.to_report() == {"kind": "abandoned", "cache_epoch": 0, "frames": 2}
    assert isinstance(decode, Decode) and decode.codes == PREROLL + BODY


def test_p2_older_epoch_cannot_discard_the_new_epochs_held_frames() -> None:
    events = [
        window(0, BODY),
        window(0, (21, 22), (), cache_epoch=1),  # a short first window of the new epoch: held
        window(1, TAIL, BODY[-3:]),  # a late chunk of the old epoch
        window(1, (23, 24, 25), (21, 22), cache_epoch=1),
    ]
    outcomes = run(Policy.TOLERANT, events)
    assert outcomes[2][0].to_report()["reason"] == "stale_cache_epoch"
    (decode,) = outcomes[3]
    assert isinstance(decode, Decode) and decode.codes == (21, 22, 23, 24, 25)
