"""Property tests of the windowing: what a talker generates arrives exactly once, in order."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.producers.windowing import StepInput, WindowingConfig, initial_state, new_ids, step
from codeclog.schemas.records import CodecChunk

# A turn is a list of units; a unit is a list of per-step id counts (mostly one id per step).
unit_strategy = st.lists(st.integers(min_value=0, max_value=3), min_size=0, max_size=45)
turn_strategy = st.lists(unit_strategy, min_size=1, max_size=5)
talk_strategy = st.lists(turn_strategy, min_size=1, max_size=4)
configs = st.builds(
    WindowingConfig,
    chunk_frames=st.integers(min_value=1, max_value=30),
    left_context_frames=st.integers(min_value=0, max_value=4),
    min_stream_body_frames=st.integers(min_value=1, max_value=6),
)


@dataclasses.dataclass
class Talk:
    """The steps of one request and the ids each epoch generated."""

    steps: list[StepInput]
    generated: dict[int, list[int]]


def script(turns: list[list[list[int]]], *, duplex: bool) -> Talk:
    """Duplex: each turn is an epoch ended by a turn-end flush. Otherwise one turn, finished."""
    steps: list[StepInput] = []
    generated: dict[int, list[int]] = defaultdict(list)
    next_id = 0
    for epoch, turn in enumerate(turns if duplex else turns[:1]):
        for unit_index, unit in enumerate(turn):
            for count in unit:
                ids = tuple((next_id + k) % 6561 for k in range(count))
                next_id += count
                generated[epoch].extend(ids)
                steps.append(_step(ids, epoch, duplex=duplex))
            last_unit = unit_index == len(turn) - 1
            steps.append(_flush(epoch, duplex=duplex, last=last_unit))
    return Talk(steps, generated)


def _step(ids: tuple[int, ...], turn: int, *, duplex: bool) -> StepInput:
    return StepInput("r", codec_ids=ids, native_duplex=duplex, duplex_turn_id=turn)


def _flush(turn: int, *, duplex: bool, last: bool) -> StepInput:
    if not duplex:
        return StepInput("r", segment_finished=not last, finished=last)
    return StepInput(
        "r", native_duplex=True, duplex_turn_id=turn, segment_finished=True, turn_end=last
    )


def run(talk: Talk, config: WindowingConfig) -> list[CodecChunk]:
    state = initial_state("r", config=config)
    out: list[CodecChunk] = []
    for step_input in talk.steps:
        state, chunks = step(state, step_input)
        out.extend(chunks)
    return out


def by_epoch(chunks: list[CodecChunk]) -> dict[int, list[CodecChunk]]:
    epochs: dict[int, list[CodecChunk]] = defaultdict(list)
    for chunk in chunks:
        epochs[chunk.cache_epoch].append(chunk)
    return epochs


@settings(max_examples=80, deadline=None)
@given(turns=talk_strategy, config=configs)
def test_every_generated_id_is_sent_exactly_once_per_turn_duplex(
    turns: list[list[list[int]]], config: WindowingConfig
) -> None:
    talk = script(turns, duplex=True)
    epochs = by_epoch(run(talk, config))
    assert sorted(epochs) == list(range(len(turns)))
    for epoch, chunks in epochs.items():
        sent = [code for chunk in chunks for code in new_ids(chunk)]
        assert sent == talk.generated[epoch]


@settings(max_examples=60, deadline=None)
@given(turns=talk_strategy, config=configs)
def test_non_duplex_segments_each_end_the_stream(
    turns: list[list[list[int]]], config: WindowingConfig
) -> None:
    # Non-duplex, every flush is last_chunk and retires the internal id: ids after the first
    # flush are not published (the upstream returns None for a retired request).
    talk = script(turns, duplex=False)
    chunks = run(talk, config)
    assert chunks and chunks[-1].last_chunk
    assert [c.last_chunk for c in chunks].count(True) == 1
    first_unit = turns[0][0]
    assert [code for c in chunks for code in new_ids(c)] == talk.generated[0][: sum(first_unit)]


@settings(max_examples=80, deadline=None)
@given(turns=talk_strategy, config=configs, duplex=st.booleans())
def test_windows_overlap_by_exactly_the_left_context(
    turns: list[list[list[int]]], config: WindowingConfig, duplex: bool
) -> None:
    left = config.left_context_frames
    for chunks in by_epoch(run(script(turns, duplex=duplex), config)).values():
        previous: tuple[int, ...] | None = None
        for chunk in chunks:
            if chunk.frames == 0:
                continue
            window = chunk.codes[: chunk.frames]
            context = window[: chunk.codec_left_context_frames]
            expected = (config.silence_code,) * left if previous is None else previous[-left:]
            assert context == (expected if left else ())
            previous = window


@settings(max_examples=80, deadline=None)
@given(turns=talk_strategy, config=configs, duplex=st.booleans())
def test_positions_and_counts_are_consistent(
    turns: list[list[list[int]]], config: WindowingConfig, duplex: bool
) -> None:
    for chunks in by_epoch(run(script(turns, duplex=duplex), config)).values():
        assert [c.chunk_seq for c in chunks] == list(range(len(chunks)))
        assert [c.last_chunk for c in chunks] == [False] * (len(chunks) - 1) + [True]
        for chunk in chunks:
            assert chunk.frames == chunk.codec_left_context_frames + chunk.codec_chunk_frames
            assert chunk.codes == (
                (0,) if chunk.frames == 0 and not chunk.last_chunk else chunk.codes
            )
            assert len(chunk.codes) == max(chunk.frames, 0 if chunk.last_chunk else 1)
            if chunk.frames == 0 and not chunk.last_chunk:
                assert chunk.tts_is_last_chunk  # the placeholder is always a unit boundary


@settings(max_examples=80, deadline=None)
@given(turns=talk_strategy)
def test_non_final_windows_meet_the_vocoder_lookahead_minimum(
    turns: list[list[list[int]]],
) -> None:
    # Code2Wav refuses a non-final window of <= 3 frames (chunk_below_lookahead_window).
    for chunk in run(script(turns, duplex=True), WindowingConfig()):
        if chunk.frames and not chunk.last_chunk:
            assert chunk.frames >= 8  # 3 context + the 5-frame minimum duplex body


@settings(max_examples=40, deadline=None)
@given(turns=talk_strategy, config=configs, data=st.data())
def test_interleaving_requests_changes_nothing(
    turns: list[list[list[int]]], config: WindowingConfig, data: st.DataObject
) -> None:
    talk = script(turns, duplex=True)
    alone = run(talk, config)
    order = data.draw(st.permutations([0] * len(talk.steps) + [1] * len(talk.steps)))
    states = {k: initial_state(k, config=config) for k in ("r", "x")}
    cursor = {0: 0, 1: 0}
    mixed: list[CodecChunk] = []
    for who in order:
        key = "r" if who == 0 else "x"
        step_input = dataclasses.replace(talk.steps[cursor[who]], request_id=key)
        cursor[who] += 1
        states[key], chunks = step(states[key], step_input)
        mixed.extend(c for c in chunks if c.request_id == "r")
    assert mixed == alone
