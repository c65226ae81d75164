"""Upstream producer tests (vllm-omni `test_minicpmo_4_5_async_chunk.py`) mirrored by behaviour.

Each test keeps the upstream name. Upstream tests that do not apply to the async-chunk windowing
are left out: the full-payload and token-only paths (`tts2code2wav_full_payload`,
`tts2code2wav_token_only`), the legacy reference-field lookup and the MRv2
`streaming_condition_seq` ledger, none of which exists here.
"""

from __future__ import annotations

import dataclasses

import pytest

from codeclog.producers.windowing import (
    InvalidStepError,
    ProducerState,
    StepInput,
    WindowingConfig,
    WindowingConfigError,
    initial_state,
    new_ids,
    step,
)
from codeclog.schemas.records import CodecChunk

S = 4218  # silence id


class Stream:
    """A tiny driver: one external request, steps in order, payloads collected."""

    def __init__(self, request_id: str = "req", **config: int) -> None:
        self.state: ProducerState = initial_state(
            request_id, producer_id="p1", config=WindowingConfig(**config)
        )

    def __call__(self, *codes: int, **fields: object) -> CodecChunk | None:
        step_input = StepInput(self.state.request_id, codec_ids=tuple(codes), **fields)  # type: ignore[arg-type]
        self.state, chunks = step(self.state, step_input)
        assert len(chunks) <= 1
        return chunks[0] if chunks else None


def duplex(**fields: object) -> dict[str, object]:
    """The upstream `_duplex_delta` defaults: epoch 3, turn 7, text "segment"."""
    base: dict[str, object] = {
        "native_duplex": True,
        "duplex_epoch": 3,
        "duplex_turn_id": 7,
        "text_utf8": b"segment",
    }
    base.update(fields)
    return base


@pytest.mark.parametrize(("count", "emitted"), [(24, False), (25, True), (26, True)])
def test_first_chunk_threshold_is_25_generated_codes(count: int, emitted: bool) -> None:
    payload = Stream()(*range(count))
    assert (payload is not None) is emitted
    if payload is not None:
        assert payload.codes == (S, S, S, *range(25))
        assert payload.chunk_seq == 0
        assert payload.code_flat_numel == 28
        assert payload.codec_chunk_frames == 25
        assert payload.codec_left_context_frames == 3


def test_steady_chunk_has_three_code_overlap_and_25_new_codes() -> None:
    stream = Stream()
    assert stream(*range(25)) is not None
    steady = stream(*range(25, 50))
    assert steady is not None
    assert steady.codes == (22, 23, 24, *range(25, 50))
    assert steady.chunk_seq == 1


def test_exact_boundary_final_flushes_held_lookahead() -> None:
    stream = Stream()
    assert stream(*range(25)) is not None
    final = stream(finished=True)
    assert final is not None
    assert final.codes == (22, 23, 24)
    assert (final.chunk_seq, final.code_flat_numel, final.last_chunk) == (1, 3, True)
    assert (final.codec_chunk_frames, final.codec_left_context_frames) == (0, 3)
    assert final.tts_is_last_chunk is True


def test_short_final_flushes_silence_prefix_and_tail() -> None:
    final = Stream()(*range(7), finished=True)
    assert final is not None
    assert final.codes == (S, S, S, *range(7))
    assert final.last_chunk is True
    assert final.code_flat_numel == 10


def test_device_codec_validity_filters_terminal_token() -> None:
    final = Stream()(2, 6561, 3, codec_frame_valid=(True, False, True), finished=True)
    assert final is not None
    assert new_ids(final) == (2, 3)


def test_device_codec_validity_must_match_the_ids() -> None:
    with pytest.raises(InvalidStepError):
        Stream()(2, 3, codec_frame_valid=(True,))


@pytest.mark.parametrize("with_validity", [False, True])
def test_empty_final_releases_wait_gate_once(with_validity: bool) -> None:
    stream = Stream()
    fields: dict[str, object] = {"finished": True}
    if with_validity:
        fields["codec_frame_valid"] = ()
    final = stream(**fields)
    assert final is not None
    assert final.codes == ()
    assert (final.chunk_seq, final.cache_epoch, final.code_flat_numel) == (0, 0, 0)
    assert final.request_id == "req"
    assert final.last_chunk is True
    assert stream(**fields) is None  # the finished internal id is retired


def test_empty_device_codec_prefill_preserves_next_chunk() -> None:
    stream = Stream()
    assert stream(codec_frame_valid=()) is None
    payload = stream(*range(25))
    assert payload is not None
    assert payload.codes == (S, S, S, *range(25))
    assert payload.chunk_seq == 0


def test_duplex_turn_end_waits_for_terminal_codec_flush() -> None:
    stream = Stream("req-duplex")
    body = stream(*range(25), **duplex(turn_end=True))
    final = stream(**duplex(turn_end=True, finished=True))
    assert body is not None and final is not None
    assert (body.last_chunk, body.turn_end) == (False, False)
    assert final.codes == (22, 23, 24)
    assert (final.last_chunk, final.turn_end) == (True, True)


@pytest.mark.parametrize(
    ("frame_count", "delta_frames", "body_chunks"),
    [(1, 1, 0), (24, 1, 0), (25, 1, 1), (26, 1, 1), (60, 1, 2), (52, 25, 2)],
)
def test_duplex_final_segment_preserves_every_code_and_closes_once(
    frame_count: int, delta_frames: int, body_chunks: int
) -> None:
    stream = Stream("final-segment")
    emitted: list[int] = []
    bodies = 0
    for start in range(0, frame_count, delta_frames):
        payload = stream(
            *range(start, min(start + delta_frames, frame_count)), **duplex(turn_end=True)
        )
        if payload is not None:
            assert (payload.last_chunk, payload.turn_end) == (False, False)
            bodies += 1
            emitted.extend(new_ids(payload))
    assert bodies == body_chunks
    final = stream(**duplex(turn_end=True, finished=True))
    assert final is not None and final.last_chunk and final.turn_end
    emitted.extend(new_ids(final))
    assert emitted == list(range(frame_count))
    # Variant L sends an empty, position-less snapshot here; on the log we send nothing.
    assert stream(**duplex(turn_end=True, finished=True)) is None


def test_first_chunk_forwards_reference_voice_and_duplex_identity() -> None:
    ref = b"\x00\x00\x80\x3f"  # one float32 sample, 1.0
    payload = Stream()(
        *range(7),
        **duplex(text_utf8=b"hello", turn_end=True, finished=True),
        ref_audio=ref,
        ref_audio_sr=16000,
    )
    assert payload is not None
    assert (payload.ref_audio, payload.ref_audio_sr) == (ref, 16000)
    assert payload.llm_output_text_utf8 == b"hello"
    assert (payload.duplex_epoch, payload.duplex_turn_id) == (3, 7)
    assert (payload.tts_is_last_chunk, payload.turn_end) == (True, True)
    assert payload.producer_id == "p1"


def test_empty_duplex_boundary_uses_zero_length_transport_placeholder() -> None:
    boundary = Stream("req-duplex")(**duplex(text_utf8=b"boundary", segment_finished=True))
    assert boundary is not None
    assert boundary.codes == (0,)
    assert boundary.code_flat_numel == 0
    assert boundary.last_chunk is False
    assert boundary.tts_is_last_chunk is True
    assert boundary.llm_output_text_utf8 == b"boundary"  # passed through, as upstream does


def test_duplex_segments_preserve_stream_state_without_closing_turn() -> None:
    stream = Stream("req-duplex")
    first = stream(
        10,
        11,
        **duplex(text_utf8=b"first", segment_finished=True),
        ref_audio=b"abcd",
        ref_audio_sr=16000,
    )
    second = stream(12, 13, **duplex(text_utf8=b"second", segment_finished=True))
    assert first is not None and second is not None
    assert (first.last_chunk, second.last_chunk) == (False, False)
    assert (first.ref_audio, first.ref_audio_sr) == (b"abcd", 16000)
    assert (second.ref_audio, second.ref_audio_sr) == (None, None)
    assert second.cache_epoch == first.cache_epoch
    assert second.chunk_seq == first.chunk_seq + 1
    assert (second.duplex_epoch, second.duplex_turn_id) == (3, 7)
    assert second.tts_is_last_chunk is True and second.turn_end is False


def test_duplex_short_units_wait_for_minimum_stream_body() -> None:
    stream = Stream("req-duplex")
    first = stream(10, 11, 12, **duplex(text_utf8=b"first", segment_finished=True))
    second = stream(13, 14, **duplex(text_utf8=b"first", segment_finished=True))
    assert first is not None and second is not None
    assert first.codes == (0,)
    assert (first.code_flat_numel, first.codec_chunk_frames) == (0, 0)
    assert (first.last_chunk, first.tts_is_last_chunk) == (False, True)
    assert second.codes == (S, S, S, 10, 11, 12, 13, 14)
    assert second.code_flat_numel == 8
    assert second.chunk_seq == first.chunk_seq + 1
    assert second.llm_output_text_utf8 == b"firstfirst"


def test_duplex_empty_finish_callback_does_not_replay_previous_text() -> None:
    stream = Stream("req-duplex")
    assert stream(*range(25), **duplex(text_utf8=b"first")) is not None
    boundary = stream(**duplex(text_utf8=b"first", segment_finished=True))
    second = stream(*range(25, 50), **duplex(text_utf8=b"second"))
    assert boundary is not None and boundary.code_flat_numel == 0
    assert second is not None and second.llm_output_text_utf8 == b"second"


def test_duplex_short_tail_does_not_replay_previous_segment_text() -> None:
    stream = Stream("req-duplex")
    a, b = "和上海之间".encode(), "的距离大约是".encode()
    first = stream(*range(25), **duplex(text_utf8=a))
    first_tail = stream(25, 26, **duplex(text_utf8=a, segment_finished=True))
    assert first is not None and first.llm_output_text_utf8 == a
    assert first_tail is not None and first_tail.code_flat_numel == 0
    assert stream(27, 28, 29, **duplex(text_utf8=b)) is None
    next_flush = stream(**duplex(text_utf8=b, segment_finished=True))
    assert next_flush is not None
    assert next_flush.llm_output_text_utf8 == b
    assert next_flush.codes == (22, 23, 24, 25, 26, 27, 28, 29)


def test_duplex_turn_end_closes_epoch_and_next_turn_restarts_sequence() -> None:
    stream = Stream("req-duplex")
    turn_end = stream(14, **duplex(duplex_turn_id=7, turn_end=True, finished=True))
    duplicate_boundary = stream(**duplex(turn_end=True, finished=True))
    next_turn = stream(20, **duplex(duplex_turn_id=8, segment_finished=True))
    assert turn_end is not None and turn_end.last_chunk and turn_end.turn_end
    assert duplicate_boundary is None
    assert next_turn is not None
    assert next_turn.cache_epoch == turn_end.cache_epoch + 1
    assert next_turn.chunk_seq == 0
    assert next_turn.last_chunk is False


def test_staggered_requests_keep_accumulators_isolated() -> None:
    a, b = Stream("a"), Stream("b")
    assert a(*range(24)) is None
    out_b = b(*range(100, 125))
    out_a = a(24)
    assert out_a is not None and out_b is not None
    assert out_b.codes == (S, S, S, *range(100, 125))
    assert out_a.codes == (S, S, S, *range(25))
    assert (out_a.request_id, out_b.request_id) == ("a", "b")


def test_cancel_drops_epoch_state_and_stale_request_cannot_publish() -> None:
    stream = Stream("req")
    assert stream(*range(10), internal_request_id="internal-0") is None
    assert stream(internal_request_id="internal-0", aborted=True, finished=True) is None
    assert stream(*range(25), internal_request_id="internal-0") is None
    payload = stream(*range(25), internal_request_id="internal-1")
    assert payload is not None
    assert (payload.cache_epoch, payload.chunk_seq) == (1, 0)
    assert payload.codes == (S, S, S, *range(25))
    assert stream.state.dropped_frames == 10 + 25


@pytest.mark.parametrize("aborted", [False, True])
def test_mrv2_abort_terminal_drops_pending_codec_frames(aborted: bool) -> None:
    stream = Stream("native")
    assert stream(*range(10), **duplex()) is None
    terminal = stream(**duplex(turn_end=True, finished=True, aborted=aborted))
    if aborted:
        assert terminal is None
        assert stream.state.codec.pending == ()
    else:
        assert terminal is not None
        assert terminal.codes[3:] == tuple(range(10))


@pytest.mark.parametrize("turn_end", [False, True])
def test_mrv2_sampled_codec_eos_flushes_resumable_segment(turn_end: bool) -> None:
    payload = Stream("native")(*range(7), **duplex(turn_end=turn_end, segment_finished=True))
    assert payload is not None
    assert payload.codes == (S, S, S, *range(7))
    assert payload.tts_is_last_chunk is True
    assert payload.last_chunk is turn_end


def test_old_sampled_eos_cannot_close_the_next_turn() -> None:
    stream = Stream("native")
    assert stream(**duplex(duplex_turn_id=8, turn_end=True)) is None  # no flush, no ids
    body = stream(*range(30), **duplex(duplex_turn_id=8, turn_end=True))
    assert body is not None and body.last_chunk is False
    tail = stream(**duplex(duplex_turn_id=8, turn_end=True, finished=True))
    assert tail is not None and tail.last_chunk is True
    assert body.codes[3:] + tail.codes[3:] == tuple(range(30))


@pytest.mark.parametrize("request_terminal", [False, True])
def test_mrv2_duplex_turn_end_keeps_live_code2wav_stream_open(request_terminal: bool) -> None:
    stream = Stream("native")
    flag = "finished" if request_terminal else "segment_finished"
    payload = stream(*range(7), **duplex(turn_end=True, **{flag: True}))
    assert payload is not None
    assert (payload.last_chunk, payload.turn_end, payload.tts_is_last_chunk) == (True, True, True)
    # The request stays live: the next turn opens the next epoch at seq 0.
    following = stream(*range(25), **duplex(duplex_turn_id=8))
    assert following is not None
    assert (following.cache_epoch, following.chunk_seq) == (1, 0)


# Configuration and input validation (upstream: ValueError from `_codec_config`).


@pytest.mark.parametrize(
    "fields",
    [
        {"chunk_frames": 0},
        {"chunk_frames": -1},
        {"left_context_frames": -1},
        {"chunk_frames": True},
        {"chunk_frames": "25"},
        {"min_stream_body_frames": 0},
        {"silence_code": 6561},
    ],
)
def test_invalid_config_raises_typed_error(fields: dict[str, object]) -> None:
    with pytest.raises(WindowingConfigError):
        WindowingConfig(**fields)  # type: ignore[arg-type]


def test_config_from_connector_extras_and_unknown_keys() -> None:
    config = WindowingConfig.from_dict({"codec_chunk_frames": 10, "codec_left_context_frames": 0})
    assert (config.chunk_frames, config.left_context_frames) == (10, 0)
    with pytest.raises(WindowingConfigError, match="initial_codec_chunk_frames"):
        WindowingConfig.from_dict({"initial_codec_chunk_frames": 5})


@pytest.mark.parametrize("bad", [-1, 6561, 7000])
def test_codec_ids_outside_the_vocabulary_are_refused(bad: int) -> None:
    with pytest.raises(InvalidStepError):
        Stream()(1, bad)


def test_step_for_another_request_is_refused() -> None:
    state = initial_state("a")
    with pytest.raises(InvalidStepError):
        step(state, StepInput("b", codec_ids=(1,)))


def test_reference_voice_without_sample_rate_is_refused() -> None:
    with pytest.raises(InvalidStepError):
        Stream()(1, ref_audio=b"abcd")


def test_reference_voice_given_early_rides_chunk_zero_only() -> None:
    stream = Stream()
    assert stream(1, ref_audio=b"abcd", ref_audio_sr=24000) is None
    first = stream(*range(2, 26))
    second = stream(*range(26, 51))
    assert first is not None and second is not None
    assert (first.ref_audio, first.ref_audio_sr) == (b"abcd", 24000)
    assert (second.ref_audio, second.ref_audio_sr) == (None, None)


def test_no_left_context_windows_do_not_overlap() -> None:
    stream = Stream(chunk_frames=4, left_context_frames=0)
    first, second = stream(1, 2, 3, 4), stream(5, 6, 7, 8)
    final = stream(finished=True)
    assert first is not None and second is not None and final is not None
    assert (first.codes, second.codes) == ((1, 2, 3, 4), (5, 6, 7, 8))
    assert (final.codes, final.code_flat_numel, final.last_chunk) == ((), 0, True)


def test_produced_at_comes_from_the_step_clock() -> None:
    payload = Stream()(*range(25), now_ms=1_700_000_000_123)
    assert payload is not None
    assert payload.produced_at_ms == 1_700_000_000_123


def test_state_is_a_value() -> None:
    stream = Stream()
    before = stream.state
    stream(*range(5))
    assert before.codec.pending == ()
    assert dataclasses.replace(before) == before
