"""The shared driver (consumers.stream.pipeline) on a deterministic stand-in engine.

These tests pin the pipeline's own logic (rounds, isolation, dead letters, rebuild); the real
vocoder runs in tests/consumer/test_vocode_*.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from codeclog.consumers.stream.fold.state import FoldConfig, Policy
from codeclog.consumers.stream.pipeline import AudioPipeline, PipelineConfig
from codeclog.kafka.records import InputRecord, Position
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk
from codeclog.vocoder.shared import pcm_s16le

SILENCE = (4218, 4218, 4218)


@dataclasses.dataclass(frozen=True)
class _State:
    seed: int
    windows: int
    tail: float


class ArithmeticEngine:
    """A state-carrying engine whose output depends on seed, history and ids only.

    Windows containing the id `poison` raise, as a vocoder failure would.
    """

    def __init__(self, poison: int = -1) -> None:
        self.poison = poison
        self.calls: list[int] = []

    def setup(self, voice: Any = None, seed: int = 0) -> _State:
        return _State(seed % 1000, 0, 0.0)

    def decode_batch(
        self, items: Sequence[tuple[Any, Sequence[int], bool]]
    ) -> list[tuple[np.ndarray, Any]]:
        self.calls.append(len(items))
        if any(self.poison in ids for _, ids, _ in items):
            raise RuntimeError("poisoned window")
        results = []
        for state, ids, final in items:
            frames = len(ids) if final else len(ids) - 3
            base = (state.seed + sum(ids) + state.tail) % 97 / 100.0
            samples = np.full(frames * 10, base, dtype=np.float32)
            results.append((samples, _State(state.seed, state.windows + 1, base)))
        return results

    def release(self, state: Any) -> None:
        pass


def _stream(rid: str, turns: int = 3, partition: int = 0) -> list[CodecChunk]:
    chunks = [CodecChunk(rid, SILENCE + tuple(range(100, 125)), 0, 0, 28, 25, 3)]
    for seq in range(1, turns):
        start = 100 + 25 * seq
        codes = tuple(range(start - 3, start + 25))
        chunks.append(CodecChunk(rid, codes, 0, seq, 28, 25, 3, last_chunk=seq == turns - 1))
    return chunks


def _records(chunks: list[CodecChunk], partition: int = 0, start: int = 0) -> list[InputRecord]:
    return [
        InputRecord(Position("chunks", partition, start + i), c.request_id.encode(), wire.encode(c))
        for i, c in enumerate(chunks)
    ]


def _interleave(*streams: list[CodecChunk]) -> list[CodecChunk]:
    out: list[CodecChunk] = []
    for i in range(max(len(s) for s in streams)):
        out.extend(s[i] for s in streams if i < len(s))
    return out


def _pipeline(engine: ArithmeticEngine, policy: Policy = Policy.TOLERANT) -> AudioPipeline:
    config = PipelineConfig(fold=FoldConfig(policy=policy), record_audio=True)
    return AudioPipeline(config, engine, clock_ms=lambda: 0)


def test_one_decode_call_serves_every_request_with_a_window() -> None:
    engine = ArithmeticEngine()
    pipeline = _pipeline(engine)
    out = pipeline.step(_records(_interleave(_stream("a"), _stream("b"), _stream("c"))))
    assert len(out.audio) == 9
    assert engine.calls == [3, 3, 3]  # one round per window position, three requests each


def test_a_vocoder_failure_rejects_only_its_request() -> None:
    good = _interleave(_stream("a"), _stream("b"))
    bad = _stream("x")
    bad[1] = dataclasses.replace(bad[1], codes=(*bad[1].codes[:-1], 6000))
    engine = ArithmeticEngine(poison=6000)
    out = _pipeline(engine).step(_records(_interleave(good[:2], bad, good[2:])))
    reasons = [d.reason for d in out.dead_letters]
    assert "vocoder_failed" in reasons
    assert {c.request_id for c in out.audio} == {"a", "b", "x"}
    assert [c.window_index for c in out.audio if c.request_id == "x"] == [0]  # before the failure
    alone = _pipeline(ArithmeticEngine()).step(_records(good))
    good_audio = [(c.request_id, c.sha256) for c in out.audio if c.request_id != "x"]
    assert good_audio == [(c.request_id, c.sha256) for c in alone.audio]


def test_undecodable_bytes_and_key_mismatch_are_dead_lettered_whole() -> None:
    chunk = _stream("a")[0]
    records = [
        InputRecord(Position("chunks", 0, 0), b"a", b"\x00garbage"),
        InputRecord(Position("chunks", 0, 1), b"b", wire.encode(chunk)),
    ]
    out = _pipeline(ArithmeticEngine()).step(records)
    assert [d.reason for d in out.dead_letters] == ["undecodable_record", "key_mismatch"]
    assert out.dead_letters[0].raw_value == b"\x00garbage"
    assert out.dead_letters[1].source_offset == 1
    assert out.audio == []


def test_a_record_without_a_key_is_dead_lettered_with_its_own_reason() -> None:
    chunk = _stream("a")[0]
    out = _pipeline(ArithmeticEngine()).step(
        [InputRecord(Position("chunks", 0, 0), None, wire.encode(chunk))]
    )
    assert [(d.reason, d.request_id, d.raw_key) for d in out.dead_letters] == [
        ("missing_key", "a", None)
    ]
    assert out.audio == [] and out.touched == {}


def test_a_dead_letter_keeps_a_bounded_prefix_of_a_huge_value() -> None:
    import hashlib
    import json

    from codeclog.consumers.stream.dead_letter import (
        DEAD_LETTER_PREFIX_BYTES,
        DEAD_LETTER_RAW_LIMIT,
    )

    huge = wire.encode(_stream("a")[0]) + b"\x00" * DEAD_LETTER_RAW_LIMIT
    small = b"\x00garbage"
    key = b"k" * 10_000
    out = _pipeline(ArithmeticEngine()).step(
        [
            InputRecord(Position("chunks", 0, 0), b"a", huge),
            InputRecord(Position("chunks", 0, 1), key, small),
        ]
    )
    letter, keyed = out.dead_letters
    assert letter.raw_value_truncated and letter.raw_value == huge[:DEAD_LETTER_PREFIX_BYTES]
    assert letter.raw_value_size == len(huge)
    assert letter.raw_value_sha256 == hashlib.sha256(huge).hexdigest()
    assert len(wire.encode(letter)) < DEAD_LETTER_PREFIX_BYTES + 2048
    assert not keyed.raw_value_truncated and keyed.raw_value == small
    assert keyed.raw_value_size == len(small) and len(keyed.raw_key or b"") == 4096
    assert json.loads(keyed.details_json)["raw_key_size"] == 10_000
    assert len(wire.encode(keyed)) < 32_000


def test_rebuilt_streams_continue_byte_identically() -> None:
    records = _records(_interleave(_stream("a", 5), _stream("b", 5)))
    whole = _pipeline(ArithmeticEngine()).step(records).audio
    live = _pipeline(ArithmeticEngine())
    live.step(records[:4])
    scratch = _pipeline(ArithmeticEngine())
    scratch.step(records[:4], emit=False)
    resumed = _pipeline(ArithmeticEngine())
    for rid in ("a", "b"):
        from codeclog.consumers.stream.fold.state import export_request, import_request

        import_request(resumed.fold_state(0), rid, export_request(live.fold_state(0), rid) or {})
    resumed.adopt_streams(scratch, ["a", "b"], 0)
    tail = resumed.step(records[4:]).audio
    assert [c.sha256 for c in tail] == [c.sha256 for c in whole[4:]]
    assert [c.window_index for c in tail] == [c.window_index for c in whole[4:]]


def test_emit_false_reports_nothing() -> None:
    out = _pipeline(ArithmeticEngine()).step(_records(_stream("a")), emit=False)
    assert out.audio == [] and out.dead_letters == []


def test_pcm_conversion_clips_and_rounds() -> None:
    pcm = pcm_s16le(np.array([2.0, -2.0, 0.5, 0.0], dtype=np.float32))
    assert np.frombuffer(pcm, "<i2").tolist() == [32767, -32767, 16383, 0]
