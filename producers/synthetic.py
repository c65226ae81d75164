"""A seeded synthetic duplex talker: per-session step scripts, and a loop that plays them.
Reasons: docs/talker.md, "The synthetic duplex talker"."""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections.abc import Callable, Iterable, Iterator, Sequence

from codeclog.errors import ConfigError
from codeclog.producers.windowing import StepInput
from codeclog.schemas.records import CODEC_VOCAB, FRAME_SECONDS

FRAMES_PER_SECOND = 25


class SyntheticConfigError(ConfigError, ValueError):
    """Invalid synthetic talker settings."""


@dataclasses.dataclass(frozen=True, slots=True)
class SyntheticConfig:
    """What the synthetic sessions look like. Probabilities are per turn unless stated."""

    sessions: int = 4
    seconds: float = 20.0  # timeline length of every session
    seed: int = 0
    min_turn_s: float = 1.0
    max_turn_s: float = 10.0
    min_gap_s: float = 0.2  # silence between turns (the user speaks)
    max_gap_s: float = 2.0
    max_unit_frames: int = 26  # a unit (segment) is at most this long; stage-0 units are ~1 s
    short_unit_probability: float = 0.15  # per unit: 1-4 frames, below the 5-frame body
    barge_in_probability: float = 0.1  # the user interrupts: abort + re-admission, new epoch
    abort_probability: float = 0.03  # the session is aborted and ends
    separate_flush_probability: float = 0.5  # per unit: flush on its own empty step

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.sessions > 100_000:
            raise SyntheticConfigError(f"sessions must be in 1..100000, got {self.sessions}")
        if not 0 < self.seconds <= 86_400:
            raise SyntheticConfigError(f"seconds must be in (0, 86400], got {self.seconds}")
        if not 0 < self.min_turn_s <= self.max_turn_s:
            raise SyntheticConfigError("turn lengths must satisfy 0 < min_turn_s <= max_turn_s")
        if not 0 <= self.min_gap_s <= self.max_gap_s:
            raise SyntheticConfigError("gaps must satisfy 0 <= min_gap_s <= max_gap_s")
        if self.max_unit_frames < 5:
            raise SyntheticConfigError("max_unit_frames must be >= 5")
        for name in ("short_unit", "barge_in", "abort", "separate_flush"):
            value = getattr(self, f"{name}_probability")
            if not 0 <= value <= 1:
                raise SyntheticConfigError(f"{name}_probability must be in [0, 1], got {value}")


@dataclasses.dataclass(frozen=True, slots=True)
class ScriptStep:
    """One talker step of one session at a point of the shared timeline."""

    frame: int  # the step happens frame / 25 s after the start
    session: int
    step: StepInput  # now_ms is 0 here; the loop stamps the wall clock


@dataclasses.dataclass(frozen=True, slots=True)
class SessionScript:
    """Everything one synthetic session will do."""

    request_id: str
    steps: tuple[ScriptStep, ...]
    turns: int  # turns started (barge-ins and the aborted one included)
    barge_ins: int
    aborted: bool
    frames: int  # codec ids generated


def request_id_for(seed: int, index: int) -> str:
    return f"s{seed}-{index:04d}"


def scripts(config: SyntheticConfig) -> list[SessionScript]:
    return [session_script(config, index) for index in range(config.sessions)]


class _Session:
    """The mutable cursor of one session while its script is generated."""

    def __init__(self, config: SyntheticConfig, index: int) -> None:
        self.config = config
        self.index = index
        self.rng = random.Random(f"codeclog-synthetic:{config.seed}:{index}")
        self.request_id = request_id_for(config.seed, index)
        self.end_frame = max(1, round(config.seconds * FRAMES_PER_SECOND))
        self.frame = self.rng.randrange(FRAMES_PER_SECOND)  # sessions start staggered
        self.generation = 0  # internal request id generation (re-admissions)
        self.duplex_epoch = 0  # the session fence epoch, bumped by barge-in
        self.turn = 0
        self.steps: list[ScriptStep] = []
        self.barge_ins = 0
        self.aborted = False
        self.frames = 0

    def add(self, codec_ids: tuple[int, ...], fields: dict[str, object]) -> None:
        step_input = StepInput(
            request_id=self.request_id,
            codec_ids=codec_ids,
            internal_request_id=f"{self.request_id}/g{self.generation}",
            native_duplex=True,
            duplex_epoch=self.duplex_epoch,
            duplex_turn_id=self.turn,
            **fields,  # type: ignore[arg-type]
        )
        self.steps.append(ScriptStep(self.frame, self.index, step_input))

    def frames_for(self, low_s: float, high_s: float) -> int:
        return round(self.rng.uniform(low_s, high_s) * FRAMES_PER_SECOND)


def session_script(config: SyntheticConfig, index: int) -> SessionScript:
    """The steps of session `index`: a pure function of the config (seed included) and index."""
    session = _Session(config, index)
    while not session.aborted:
        session.frame += session.frames_for(config.min_gap_s, config.max_gap_s)
        if session.frame >= session.end_frame:
            break
        _turn(session)
        session.turn += 1
    return SessionScript(
        request_id=session.request_id,
        steps=tuple(session.steps),
        turns=session.turn,
        barge_ins=session.barge_ins,
        aborted=session.aborted,
        frames=session.frames,
    )


def _turn(session: _Session) -> None:
    config, rng = session.config, session.rng
    length = max(1, session.frames_for(config.min_turn_s, config.max_turn_s))
    truncated = session.frame + length >= session.end_frame
    length = min(length, session.end_frame - session.frame)
    fate = rng.random()
    if fate < config.abort_probability + config.barge_in_probability:
        _interrupted_turn(session, length, abort=fate < config.abort_probability)
        return
    units = _unit_lengths(rng, length, config)
    for number, unit_frames in enumerate(units):
        last = number == len(units) - 1
        _unit(session, unit_frames, number, last=last, request_ends=last and truncated)


def _unit_lengths(rng: random.Random, total: int, config: SyntheticConfig) -> list[int]:
    lengths = []
    while total > 0:
        if rng.random() < config.short_unit_probability:
            size = rng.randint(1, 4)
        else:
            size = rng.randint(5, config.max_unit_frames)
        size = min(size, total)
        lengths.append(size)
        total -= size
    return lengths


def _unit(session: _Session, frames: int, number: int, *, last: bool, request_ends: bool) -> None:
    """One unit: an id per frame, then the flush (the turn end on the last unit)."""
    text = f"turn {session.turn} unit {number} · ".encode()
    separate = session.rng.random() < session.config.separate_flush_probability
    flush: dict[str, object] = {"segment_finished": True, "text_utf8": text}
    if last:
        # A turn cut by the end of the session finishes the request outside a turn end (the
        # talker sends a unit boundary and a FINISH); otherwise the turn closes its epoch.
        flush.update(finished=request_ends, turn_end=not request_ends)
    for offset in range(frames):
        ids = (session.rng.randrange(CODEC_VOCAB),)
        session.frames += 1
        if offset == frames - 1 and not separate:
            session.add(ids, flush)
        else:
            session.add(ids, {"text_utf8": text})
        session.frame += 1
    if separate:
        session.add((), flush)


def _interrupted_turn(session: _Session, length: int, *, abort: bool) -> None:
    """The talker speaks part of a turn, then its request is aborted (barge-in or session end)."""
    text = f"turn {session.turn} interrupted · ".encode()
    spoken = session.rng.randint(1, length)
    for _ in range(spoken):
        session.add((session.rng.randrange(CODEC_VOCAB),), {"text_utf8": text})
        session.frames += 1
        session.frame += 1
    session.add((), {"aborted": True, "finished": True})
    if abort:
        session.aborted = True
        return
    session.barge_ins += 1
    session.generation += 1  # re-admission: the next turn runs under a new internal id
    session.duplex_epoch += 1


def merged(session_scripts: Sequence[SessionScript]) -> Iterator[ScriptStep]:
    """All steps on the shared timeline: by frame, then session, keeping each session's order."""
    streams = [script.steps for script in session_scripts]
    return heapq.merge(*streams, key=lambda item: (item.frame, item.session))


# ---------------------------------------------------------------------------------------------
# The publishing loop


@dataclasses.dataclass(frozen=True, slots=True)
class Progress:
    """Where the loop is, for a progress line."""

    timeline_s: float  # position on the session timeline
    total_s: float
    steps: int
    records: int


@dataclasses.dataclass(frozen=True, slots=True)
class PlayResult:
    steps: int
    records: int
    elapsed_s: float
    timeline_s: float


def due_s(item: ScriptStep, phases: int = 1) -> float:
    """When `item` is due, in seconds from the start of the timeline. With `phases` n > 1,
    session i steps (i mod n) / n of a frame after the grid: n talkers whose frame clocks are
    not aligned, instead of every session's step at the same instant each 40 ms. merged()
    orders a frame's steps by session, so with n at least the session count the order of the
    steps is the order of these times."""
    return _due_s(item, _checked(phases))


def _due_s(item: ScriptStep, phases: int) -> float:
    return (item.frame + (item.session % phases) / phases) * FRAME_SECONDS


def _checked(phases: int) -> int:
    if phases < 1:
        raise SyntheticConfigError(f"phases must be >= 1, got {phases}")
    return phases


def play(
    steps: Iterable[ScriptStep],
    apply: Callable[[StepInput], Sequence[object]],
    *,
    total_s: float,
    realtime: bool,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    now_ms: Callable[[], int],
    on_progress: Callable[[Progress], None] | None = None,
    progress_every_s: float = 0.5,
    phases: int = 1,
) -> PlayResult:
    """Feed every step to `apply`; with `realtime`, each step waits until it is due
    (`due_s(step, phases)`: frame/25 s, plus its session's phase)."""
    _checked(phases)
    start = clock()
    next_report = start
    count = records = 0
    frame = 0
    for item in steps:
        frame = item.frame
        if realtime:
            _wait_until(start + _due_s(item, phases), clock, sleep)  # phases checked above
        records += len(apply(dataclasses.replace(item.step, now_ms=now_ms())))
        count += 1
        if on_progress is not None and clock() >= next_report:
            on_progress(Progress(frame * FRAME_SECONDS, total_s, count, records))
            next_report = clock() + progress_every_s
    if on_progress is not None:
        on_progress(Progress(frame * FRAME_SECONDS, total_s, count, records))
    return PlayResult(count, records, clock() - start, frame * FRAME_SECONDS)


def _wait_until(
    deadline: float, clock: Callable[[], float], sleep: Callable[[float], None]
) -> None:
    delay = deadline - clock()
    if delay > 0:
        sleep(delay)
