"""Arbitrary bytes and arbitrary records through wire decode + fold + pipeline together.

The property: `AudioPipeline.step` never raises, whatever the records (garbage bytes, truncated
or bit-flipped encodings, records of the wrong type, keys that disagree with the payload,
hundreds of events, ids of thousands of characters, code lists of tens of thousands of ids), and
everything it refuses is dead-lettered: exactly one dead letter per record that does not decode
to an input event or whose key disagrees, exactly one per fold rejection (checked against an
independent fold of the decoded events), each carrying the record's raw bytes and position and
itself encodable for the DLQ topic. With a cheap engine, the audio chunks are exactly the fold's
decode windows.

Depth: CODECLOG_PROPERTY_EXAMPLES (default 60) sets max_examples; a deeper run sets it to a few
thousand (`CODECLOG_PROPERTY_EXAMPLES=5000 pytest tests/consumer/test_pipeline_properties.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codeclog.consumers.stream.fold.outcomes import Decode, Reject, RejectReason
from codeclog.consumers.stream.fold.rules import fold
from codeclog.consumers.stream.fold.state import FoldConfig, Policy, new_state
from codeclog.consumers.stream.pipeline import AudioPipeline, PipelineConfig
from codeclog.consumers.stream.wire_input import KEY_MISMATCH, MISSING_KEY
from codeclog.kafka.records import InputRecord, Position
from codeclog.schemas import wire
from codeclog.schemas.records import AudioChunk, CodecChunk, ControlEvent, DeadLetter
from codeclog.testing.upstream_streams import realistic_events
from tests.schemas.strategies import Draws, records_of

EXAMPLES = int(os.environ.get("CODECLOG_PROPERTY_EXAMPLES", "60"))
PROPERTY_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PARTITIONS = 3


class CheapEngine:
    """Output depends on the state, the ids and `final` only; never fails; any window size."""

    def setup(self, voice: Any = None, seed: int = 0) -> int:
        return seed % 1000

    def decode_batch(
        self, items: Sequence[tuple[Any, Sequence[int], bool]]
    ) -> list[tuple[np.ndarray, Any]]:
        results = []
        for state, ids, final in items:
            frames = max(len(ids) if final else len(ids) - 3, 0)
            level = (state + len(ids)) % 97 / 100.0
            results.append((np.full(frames, level, dtype=np.float32), state + 1))
        return results

    def release(self, state: Any) -> None:
        pass


# ---- strategies ---------------------------------------------------------------------------
INT32 = st.one_of(st.integers(-2, 5), st.integers(-(2**31), 2**31 - 1))  # small ones collide
INT64 = st.one_of(st.integers(-2, 5), st.integers(-(2**63), 2**63 - 1))
request_ids = st.one_of(
    st.sampled_from(["a", "b", "", "session-00000"]),
    st.text(max_size=6),
    st.builds(lambda s, n: (s or "x") * n, st.text(max_size=4), st.integers(100, 3000)),  # long
)
codes = st.one_of(
    st.lists(st.one_of(st.integers(0, 6560), INT32), max_size=40).map(tuple),
    # huge lists, cheap to draw: a run of one id, or a ramp through the codebook
    st.builds(lambda c, n: (c,) * n, st.integers(0, 6560), st.integers(100, 30_000)),
    st.builds(lambda s, n: tuple((s + i) % 6561 for i in range(n)), INT32, st.integers(0, 20_000)),
)
DRAWS = Draws(
    int32=INT32,
    int64=INT64,
    text=st.text(max_size=8),
    blob=st.binary(max_size=16),
    request_ids=request_ids,
    codes=codes,
    int_lists=st.lists(INT32, max_size=4).map(tuple),
)
chunks = records_of(CodecChunk, DRAWS)
controls = records_of(ControlEvent, DRAWS)
other_records = st.one_of(records_of(AudioChunk, DRAWS), records_of(DeadLetter, DRAWS))  # not input


@st.composite
def damaged(draw: st.DrawFn, record: Any) -> bytes:
    """An encoding cut short, with a flipped bit, or with bytes appended."""
    data = bytearray(wire.encode(record))
    how = draw(st.sampled_from(["truncate", "flip", "append"]))
    if how == "truncate":
        return bytes(data[: draw(st.integers(0, max(len(data) - 1, 0)))])
    if how == "flip" and data:
        index = draw(st.integers(0, len(data) - 1))
        data[index] ^= 1 << draw(st.integers(0, 7))
        return bytes(data)
    return bytes(data) + draw(st.binary(min_size=1, max_size=8))


@st.composite
def values(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """(value bytes, the request id the key should carry or None for a random key)."""
    kind = draw(st.sampled_from(["event", "event", "event", "other", "damaged", "bytes"]))
    if kind == "event":
        event = draw(st.one_of(chunks, controls))
        return wire.encode(event), event.request_id
    if kind == "other":
        return wire.encode(draw(other_records)), None
    if kind == "damaged":
        return draw(damaged(draw(st.one_of(chunks, controls)))), None
    return draw(st.binary(max_size=64)), None


@st.composite
def record_batches(draw: st.DrawFn) -> list[list[InputRecord]]:
    """Hundreds of records: realistic sessions (valid, so windows really decode) with arbitrary
    records mixed in, spread over partitions, cut into steps of arbitrary sizes."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    sessions, turns = draw(st.integers(0, 10)), draw(st.integers(1, 3))
    realistic = realistic_events(rng, sessions=sessions, turns=turns)
    drawn = draw(st.lists(values(), max_size=60))
    items: list[tuple[bytes, str | None]] = [(wire.encode(e), e.request_id) for e in realistic]
    for value in drawn:
        items.insert(rng.randint(0, len(items)), value)
    offsets = [0] * PARTITIONS
    records = []
    for value, rid in items:
        partition = rng.randrange(PARTITIONS)
        key_kind = rng.random()
        if rid is not None and key_kind < 0.8:
            key: bytes | None = rid.encode()
        elif key_kind < 0.9:
            key = None
        else:
            key = rng.randbytes(rng.randint(0, 8))
        position = Position("chunks", partition, offsets[partition], 1_000 + offsets[partition])
        offsets[partition] += 1
        records.append(InputRecord(position, key, value))
    batches, start = [], 0
    while start < len(records):
        size = rng.choice([1, 2, 7, 32, 500])
        batches.append(records[start : start + size])
        start += size
    return batches


# ---- the independent expectation ----------------------------------------------------------
@dataclasses.dataclass
class Expected:
    refusals: Counter[tuple[int, int, str]]  # (partition, offset, reason) -> count
    windows: int


def expected(batches: list[list[InputRecord]], config: FoldConfig) -> Expected:
    states = {p: new_state(config) for p in range(PARTITIONS)}
    refusals: Counter[tuple[int, int, str]] = Counter()
    windows = 0
    for record in (r for batch in batches for r in batch):
        where = (record.position.partition, record.position.offset)
        try:
            event = wire.decode(record.value)
        except wire.DecodeError:
            refusals[(*where, RejectReason.UNDECODABLE_RECORD.value)] += 1
            continue
        if not isinstance(event, CodecChunk | ControlEvent):
            refusals[(*where, RejectReason.UNDECODABLE_RECORD.value)] += 1
            continue
        if record.key is None and event.request_id:
            refusals[(*where, MISSING_KEY)] += 1
            continue
        if record.key is not None and record.key != event.request_id.encode():
            refusals[(*where, KEY_MISMATCH)] += 1
            continue
        _, outcomes = fold(states[record.position.partition], event)
        for outcome in outcomes:
            if isinstance(outcome, Reject):
                refusals[(*where, outcome.reason.value)] += 1
            windows += isinstance(outcome, Decode)
    return Expected(refusals, windows)


def _check_letter(letter: DeadLetter, by_position: dict[tuple[int, int], InputRecord]) -> None:
    record = by_position[(letter.source_partition, letter.source_offset)]
    assert letter.source_topic == record.position.topic
    # the bytes whole, or (issue 16: a dead letter must fit) a named, checkable prefix
    assert letter.raw_value_size == len(record.value)
    assert letter.raw_value_sha256 == hashlib.sha256(record.value).hexdigest()
    if letter.raw_value_truncated:
        assert record.value.startswith(letter.raw_value) and letter.raw_value != record.value
    else:
        assert letter.raw_value == record.value
    if letter.raw_key != record.key:
        assert record.key is not None and letter.raw_key is not None
        assert record.key.startswith(letter.raw_key)
        assert '"raw_key_truncated":true' in letter.details_json.replace("\\", "")
    assert wire.decode(wire.encode(letter)) == letter  # the DLQ topic can carry it


@PROPERTY_SETTINGS
@given(
    batches=record_batches(),
    policy=st.sampled_from(Policy),
    engine=st.sampled_from(["none", "cheap"]),
)
def test_arbitrary_records_never_raise_and_every_refusal_is_dead_lettered(
    batches: list[list[InputRecord]], policy: Policy, engine: str
) -> None:
    fold_config = FoldConfig(policy=policy)
    pipeline = AudioPipeline(
        PipelineConfig(fold=fold_config), None if engine == "none" else CheapEngine()
    )
    letters: list[DeadLetter] = []
    audio: list[AudioChunk] = []
    windows = 0
    for batch in batches:
        out = pipeline.step(batch)
        assert out.records == len(batch)
        letters += out.dead_letters
        audio += out.audio
        windows += out.windows
    want = expected(batches, fold_config)
    got = Counter((d.source_partition, d.source_offset, d.reason) for d in letters)
    assert got == want.refusals
    by_position = {(r.position.partition, r.position.offset): r for b in batches for r in b}
    for letter in letters:
        _check_letter(letter, by_position)
    assert windows == want.windows
    assert len(audio) == (0 if engine == "none" else want.windows)
    for chunk in audio:
        assert wire.decode(wire.encode(chunk)) == chunk
