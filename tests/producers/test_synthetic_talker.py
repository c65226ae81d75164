"""The seeded synthetic talker: determinism, shapes, and the publishing loop."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.producers.synthetic import (
    FRAMES_PER_SECOND,
    SyntheticConfig,
    SyntheticConfigError,
    due_s,
    merged,
    play,
    request_id_for,
    scripts,
    session_script,
)
from codeclog.producers.talker import Record, Talker
from codeclog.producers.windowing import new_ids
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind


class ListSink:
    def __init__(self) -> None:
        self.records: list[Record] = []

    def publish(self, record: Record) -> None:
        self.records.append(record)


def publish(config: SyntheticConfig) -> list[Record]:
    sink = ListSink()
    talker = Talker(sink, producer_id="syn", native_duplex=True)
    tick = iter(range(10**9))
    play(
        merged(scripts(config)),
        talker.apply,
        total_s=config.seconds,
        realtime=False,
        clock=lambda: 0.0,
        sleep=lambda _s: None,
        now_ms=lambda: next(tick),
    )
    return sink.records


CONFIG = SyntheticConfig(sessions=6, seconds=40, seed=3, barge_in_probability=0.3)


def test_same_seed_same_streams() -> None:
    assert scripts(CONFIG) == scripts(CONFIG)
    assert publish(CONFIG) == publish(CONFIG)


def test_another_seed_other_streams() -> None:
    other = dataclasses.replace(CONFIG, seed=4)
    assert [s.steps for s in scripts(CONFIG)] != [s.steps for s in scripts(other)]
    assert publish(CONFIG) != publish(other)


def test_request_ids_come_from_the_seed() -> None:
    assert [s.request_id for s in scripts(CONFIG)] == [f"s3-{i:04d}" for i in range(6)]
    assert request_id_for(12, 7) == "s12-0007"
    assert session_script(CONFIG, 2) == scripts(CONFIG)[2]  # a session does not depend on others


def test_sessions_exercise_every_path() -> None:
    config = SyntheticConfig(
        sessions=10, seconds=45, seed=11, barge_in_probability=0.2, abort_probability=0.1
    )
    all_scripts = scripts(config)
    records = publish(config)
    chunks = [r for r in records if isinstance(r, CodecChunk)]
    controls = {r.kind for r in records if isinstance(r, ControlEvent)}
    assert sum(s.barge_ins for s in all_scripts) > 0
    assert any(s.aborted for s in all_scripts)
    assert controls == {ControlKind.ABORT, ControlKind.FINISH}
    assert any(c.frames == 0 and not c.last_chunk for c in chunks)  # [0] placeholders
    assert any(c.cache_epoch >= 2 for c in chunks)  # turn ends and re-admissions
    assert all(len(s.steps) > 0 for s in all_scripts)


def test_steps_stay_on_the_timeline_and_pace_at_25_frames_per_second() -> None:
    for script in scripts(CONFIG):
        frames = [step.frame for step in script.steps]
        assert frames == sorted(frames)
        assert frames[-1] <= CONFIG.seconds * FRAMES_PER_SECOND + 1
        ids_per_frame: dict[int, int] = {}
        for step in script.steps:
            ids_per_frame[step.frame] = ids_per_frame.get(step.frame, 0) + len(step.step.codec_ids)
        assert max(ids_per_frame.values()) == 1  # one codec id per 40 ms step


def test_every_generated_id_of_a_closed_turn_is_published_once() -> None:
    config = SyntheticConfig(
        sessions=5, seconds=30, seed=5, barge_in_probability=0, abort_probability=0
    )
    records = publish(config)
    for script in scripts(config):
        sent = [
            code
            for r in records
            if isinstance(r, CodecChunk) and r.request_id == script.request_id
            for code in new_ids(r)
        ]
        generated = [code for step in script.steps for code in step.step.codec_ids]
        assert sent == generated


def test_realtime_play_sleeps_until_each_frame() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    steps = list(merged(scripts(SyntheticConfig(sessions=1, seconds=6, seed=1))))
    result = play(
        steps,
        lambda _step: [],
        total_s=6,
        realtime=True,
        clock=lambda: now[0],
        sleep=sleep,
        now_ms=lambda: 0,
    )
    assert steps
    assert now[0] == pytest.approx(steps[-1].frame * 0.04)
    assert all(delay > 0 for delay in slept)
    assert result.steps == len(steps)
    assert result.elapsed_s == pytest.approx(now[0])


def test_phased_play_spreads_the_sessions_over_each_frame() -> None:
    now = [0.0]
    applied: list[float] = []

    def sleep(seconds: float) -> None:
        now[0] += seconds

    def apply(_step: object) -> list[object]:
        applied.append(now[0])
        return []

    steps = list(merged(scripts(SyntheticConfig(sessions=4, seconds=6, seed=1))))
    play(
        steps,
        apply,
        total_s=6,
        realtime=True,
        clock=lambda: now[0],
        sleep=sleep,
        now_ms=lambda: 0,
        phases=4,
    )
    # session i of 4 steps i/4 of a frame (10 ms) after the grid, each step when it is due
    assert applied == pytest.approx([s.frame * 0.04 + s.session * 0.01 for s in steps])
    shared = len({s.frame for s in steps})
    assert len({round(at, 9) for at in applied}) > shared  # a frame's steps are apart


@settings(max_examples=40, deadline=None)
@given(
    sessions=st.integers(1, 12),
    seconds=st.floats(0.5, 6),
    seed=st.integers(0, 1000),
)
def test_phased_due_times_follow_the_merged_order(sessions: int, seconds: float, seed: int) -> None:
    config = SyntheticConfig(sessions=sessions, seconds=seconds, seed=seed)
    steps = list(merged(scripts(config)))
    phased = [due_s(s, sessions) for s in steps]
    assert phased == sorted(phased)  # realtime play never waits for an earlier step's time
    assert all(0 <= due - s.frame * 0.04 < 0.04 for s, due in zip(steps, phased, strict=True))
    assert [due_s(s) for s in steps] == [s.frame * 0.04 for s in steps]  # aligned: the grid


def test_phases_below_one_are_refused() -> None:
    step = next(merged(scripts(SyntheticConfig(sessions=1, seconds=6, seed=1))))
    with pytest.raises(SyntheticConfigError, match="phases must be >= 1"):
        due_s(step, 0)
    with pytest.raises(SyntheticConfigError, match="phases must be >= 1"):
        play(
            [step],
            lambda _s: [],
            total_s=1,
            realtime=False,
            clock=lambda: 0.0,
            sleep=lambda _s: None,
            now_ms=lambda: 0,
            phases=0,
        )


@pytest.mark.parametrize(
    "fields",
    [
        {"sessions": 0},
        {"seconds": 0},
        {"min_turn_s": 5, "max_turn_s": 1},
        {"barge_in_probability": 1.5},
        {"max_unit_frames": 4},
    ],
)
def test_invalid_synthetic_config(fields: dict[str, float]) -> None:
    with pytest.raises(SyntheticConfigError):
        SyntheticConfig(**fields)  # type: ignore[arg-type]
