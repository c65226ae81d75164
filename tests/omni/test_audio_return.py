"""Mode 2's return path without Kafka or vllm-omni: the router (omni.audio_return) and the
waveform the relay hands to vllm-omni (omni.relay)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.consumers.readers.deliveries import ListenerChunk
from codeclog.omni.audio_return import Failure, ReturnRouter, Window
from codeclog.omni.relay import pcm_of, window_output
from codeclog.schemas.records import ControlEvent, ControlKind, DeadLetter

PCM = np.arange(-480, 480, dtype="<i2").tobytes()


def _chunk(rid: str, index: int, final: bool = False, **more: object) -> ListenerChunk:
    fields = {
        "request_id": rid,
        "cache_epoch": 0,
        "window_index": index,
        "sample_offset": index * 960,
        "sample_rate_hz": 24000,
        "pcm": PCM,
        "final": final,
        "end": "final" if final else None,
        "gap_samples": 0,
        "received_at": 0.0,
        "source_produced_at_ms": 0,
        "determinism_domain": "d",
    }
    return ListenerChunk(**{**fields, **more})  # type: ignore[arg-type]


def test_windows_go_to_the_registered_request_in_order_and_the_final_one_ends_it() -> None:
    router = ReturnRouter(wait_s=10.0)
    router.register("internal-1", "r1", 0.0)
    assert router.on_chunk(_chunk("other", 0), 0.0) == []  # not this server's request
    first = router.on_chunk(_chunk("r1", 0), 1.0)
    last = router.on_chunk(_chunk("r1", 1, final=True), 2.0)
    assert [type(e) for e in first + last] == [Window, Window]
    assert [(e.request_id, e.final) for e in first + last] == [  # type: ignore[union-attr]
        ("internal-1", False),
        ("internal-1", True),
    ]
    assert len(router) == 0 and router.on_chunk(_chunk("r1", 2), 3.0) == []
    assert router.counts == {"windows": 2, "finished": 1, "failed": 0}


def test_a_dead_letter_an_abort_a_gap_or_a_stream_ended_without_audio_fail_the_request() -> None:
    router = ReturnRouter(wait_s=0.0)
    for n in range(4):
        router.register(f"i{n}", f"r{n}", 0.0)
    letter = DeadLetter("invalid_codes", "codec.chunks", 0, 5, b"", request_id="r0", chunk_seq=3)
    abort = ControlEvent("r1", ControlKind.ABORT, reason="talker: not delivered")
    events = (
        router.on_dead_letter(letter)
        + router.on_abort(abort)
        + router.on_chunk(_chunk("r2", 1, gap_samples=960), 1.0)
        + router.on_chunk(_chunk("r3", 0, pcm=b"", end="evicted"), 1.0)
    )
    assert all(isinstance(e, Failure) for e in events)
    reasons = {e.request_id: e.reason for e in events}
    assert "chunk_seq 3 was dead-lettered: invalid_codes" in reasons["i0"]
    assert "aborted on the log: talker: not delivered" in reasons["i1"]
    assert "960 samples never written" in reasons["i2"]
    assert "ended without audio: evicted" in reasons["i3"]
    assert len(router) == 0 and router.expire(1e9) == []  # wait_s 0: no bound


def test_a_request_nothing_came_for_in_the_wait_fails_and_a_window_restarts_the_wait() -> None:
    router = ReturnRouter(wait_s=5.0)
    router.register("i", "r", 0.0)
    assert router.expire(4.9) == []
    assert router.on_chunk(_chunk("r", 0), 4.9)
    assert router.expire(9.8) == []
    (failure,) = router.expire(9.9)
    assert isinstance(failure, Failure) and "no audio for 5 s" in failure.reason
    router.register("j", "q", 0.0)
    router.unregister("j")  # aborted by vllm-omni: forgotten, never failed
    assert router.expire(100.0) == []


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-(2**15), 2**15 - 1), min_size=1, max_size=2000))
def test_the_waveform_handed_to_vllm_omni_gives_back_the_topic_s_pcm_exactly(
    samples: list[int],
) -> None:
    pcm = np.array(samples, dtype="<i2").tobytes()
    chunk = _chunk("r", 0, pcm=pcm)
    window = Window("i", pcm, 24000, False, chunk)
    output = window_output(window)
    waveform = output["model_outputs"]
    assert waveform.dtype.is_floating_point and str(waveform.dtype) == "torch.float32"
    assert waveform.ndim == 1 and float(waveform.abs().max()) <= 1.0
    assert int(output["sr"]) == 24000
    assert pcm_of(waveform.numpy()) == pcm
    assert dataclasses.replace(window, final=True).final
