"""Table-driven tests of the lag evaluator: one named case per rule, plus property tests."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codeclog.lag.evaluator import (
    RULE_STATUS,
    EvaluatorConfig,
    GroupRule,
    GroupStatus,
    LagConfigError,
    LagWindows,
    PartitionId,
    PartitionStatus,
    Rule,
    Sample,
    evaluate_partition,
    group_rules,
    group_status,
)

CONFIG = EvaluatorConfig(
    window_samples=10,
    allowed_lag=0,
    stuck_after_ms=30_000,
    warn_growth_records=100,
    warn_min_samples=5,
)
STEP_MS = 10_000
T0_MS = 1_700_000_000_000


def window(
    committed: list[int | None], lags: list[int | None], owned: bool | None = None
) -> list[Sample]:
    """Samples STEP_MS apart; end offset = committed + lag (None when either is None)."""
    samples = []
    for i, (offset, lag) in enumerate(zip(committed, lags, strict=True)):
        end = None if offset is None or lag is None else offset + lag
        samples.append(Sample.from_offsets(T0_MS + i * STEP_MS, offset, end, owned=owned))
    return samples


def with_lags(samples: list[Sample], time_s: float | None, audio_s: float | None) -> list[Sample]:
    """The same window, the latest sample with the given time and audio lag."""
    last = dataclasses.replace(samples[-1], time_lag_s=time_s, audio_lag_s=audio_s)
    return [*samples[:-1], last]


def now_after(samples: list[Sample], extra_ms: int = 0) -> int:
    return (samples[-1].observed_at_ms if samples else T0_MS) + extra_ms


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    samples: list[Sample]
    expected: Rule
    extra_ms: int = 0  # now = last sample + extra_ms
    config: EvaluatorConfig = CONFIG


CASES = [
    Case("no_data_empty_window", [], Rule.NO_DATA),
    Case("no_data_no_committed_offset", window([None, None], [None, None]), Rule.NO_DATA),
    Case(
        "within_allowed_lag_caught_up", window([100, 120, 140], [5, 3, 0]), Rule.WITHIN_ALLOWED_LAG
    ),
    Case(
        "within_allowed_lag_threshold",
        window([100, 100, 100, 100, 100], [5, 5, 5, 5, 5]),
        Rule.WITHIN_ALLOWED_LAG,
        config=dataclasses.replace(CONFIG, allowed_lag=5),
    ),
    Case("stop_no_progress_and_nobody_owns", window([100] * 5, [10, 20, 30, 40, 50]), Rule.STOP),
    Case(
        "stop_when_group_has_no_member_for_it",
        window([100] * 5, [10, 20, 30, 40, 50], owned=False),
        Rule.STOP,
    ),
    Case(
        "stop_counts_idle_time_past_the_last_sample",
        window([90, 100, 100], [10, 10, 10]),
        Rule.STOP,
        extra_ms=25_000,
    ),
    Case(
        "stop_before_rewind",
        window([200, 150, 150, 150, 150], [10, 60, 70, 80, 90]),
        Rule.STOP,
    ),
    Case(
        "stop_suppressed_when_caught_up_in_window",
        window([100] * 5, [0, 10, 20, 30, 40]),
        Rule.LAG_WAS_ZERO,
    ),
    Case("rewind_offset_went_back", window([100, 200, 150], [50, 50, 100]), Rule.REWIND),
    Case(
        "rewind_even_when_caught_up_earlier",
        window([100, 200, 150], [0, 0, 100]),
        Rule.REWIND,
    ),
    Case(
        "rewind_recovered_is_not_rewind",
        window([100, 200, 150, 250], [50, 50, 100, 50]),
        Rule.NOT_GROWING,
    ),
    Case(
        "lag_was_zero_in_window", window([100, 110, 120, 130], [0, 20, 40, 60]), Rule.LAG_WAS_ZERO
    ),
    Case("stall_owned_but_not_moving", window([100] * 5, [50] * 5, owned=True), Rule.STALL),
    Case(
        "stall_needs_stuck_time",
        window([100] * 3, [50] * 3, owned=True),
        Rule.NOT_GROWING,
    ),
    Case(
        "growing_sustained",
        window([100, 110, 120, 130, 140], [10, 40, 80, 120, 160]),
        Rule.GROWING,
    ),
    Case(
        "growing_with_noise_warns_where_burrow_would_not",
        window([100, 110, 120, 130, 140, 150], [10, 60, 40, 100, 90, 150]),
        Rule.GROWING,
    ),
    Case(
        "growing_needs_min_samples",
        window([100, 110, 120, 130], [10, 60, 110, 160]),
        Rule.NOT_GROWING,
    ),
    Case(
        "growing_needs_growth_above_threshold",
        window([100, 110, 120, 130, 140], [10, 30, 50, 70, 100]),
        Rule.NOT_GROWING,
    ),
    Case(
        "growing_needs_positive_trend",
        window([100, 110, 120, 130, 140, 150], [10, 500, 400, 300, 200, 115]),
        Rule.NOT_GROWING,
    ),
    Case("not_growing_steady_lag", window([100, 150, 200, 250, 300], [50] * 5), Rule.NOT_GROWING),
    # absolute thresholds (max_time_lag_s 3, max_audio_lag_s 5) while the window is young
    Case("time_lag_above_one_shot", with_lags(window([100], [4]), 3.5, 1.0), Rule.TIME_LAG_ABOVE),
    Case(
        "time_lag_above_first_samples",
        with_lags(window([100, 100, 100], [2, 3, 4]), 9.0, 4.0),
        Rule.TIME_LAG_ABOVE,
    ),
    Case(
        "time_lag_above_a_never_committed_partition",
        with_lags([Sample(T0_MS, None, 7, 7)], 12.0, 7.0),
        Rule.TIME_LAG_ABOVE,
    ),
    Case(
        "time_lag_above_before_lag_was_zero",
        with_lags(window([100, 100], [0, 6]), 4.0, 6.0),
        Rule.TIME_LAG_ABOVE,
    ),
    Case(
        "time_lag_at_threshold_is_not_above",
        with_lags(window([100], [3]), 3.0, 5.0),
        Rule.NOT_GROWING,
    ),
    Case("audio_lag_above_one_shot", with_lags(window([100], [6]), 0.5, 6.0), Rule.AUDIO_LAG_ABOVE),
    Case(
        "thresholds_only_while_young",
        with_lags(window([100, 110, 120, 130], [10, 10, 10, 10]), 30.0, 60.0),
        Rule.NOT_GROWING,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rule(case: Case) -> None:
    verdict = evaluate_partition(case.samples, now_after(case.samples, case.extra_ms), case.config)
    assert verdict.rule is case.expected
    assert verdict.status is RULE_STATUS[case.expected]


def test_every_rule_has_a_named_case() -> None:
    assert {c.expected for c in CASES} == set(Rule)


GROUP_CASES = [
    ("group_ok_when_empty", [], GroupStatus.OK),
    ("group_ok", [PartitionStatus.OK, PartitionStatus.OK], GroupStatus.OK),
    ("group_warn", [PartitionStatus.OK, PartitionStatus.WARN], GroupStatus.WARN),
    ("group_err_stop", [PartitionStatus.WARN, PartitionStatus.STOP], GroupStatus.ERR),
    ("group_err_stall", [PartitionStatus.STALL, PartitionStatus.OK], GroupStatus.ERR),
    ("group_err_rewind", [PartitionStatus.OK, PartitionStatus.REWIND], GroupStatus.ERR),
    ("group_err_lagging", [PartitionStatus.OK, PartitionStatus.LAGGING], GroupStatus.ERR),
]


@pytest.mark.parametrize(
    ("name", "statuses", "expected"), GROUP_CASES, ids=[c[0] for c in GROUP_CASES]
)
def test_group_status(name: str, statuses: list[PartitionStatus], expected: GroupStatus) -> None:
    assert group_status(statuses) is expected


BAD_CONFIGS = [
    ("window_too_small", {"window_samples": 1}),
    ("negative_allowed_lag", {"allowed_lag": -1}),
    ("negative_stuck_after", {"stuck_after_ms": -1}),
    ("warn_samples_above_window", {"window_samples": 5, "warn_min_samples": 6}),
    ("warn_samples_below_two", {"warn_min_samples": 1}),
    ("negative_max_time_lag", {"max_time_lag_s": -1}),
    ("nan_max_audio_lag", {"max_audio_lag_s": float("nan")}),
]


@pytest.mark.parametrize(("name", "changes"), BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_config_refuses(name: str, changes: dict[str, float]) -> None:
    with pytest.raises(LagConfigError):
        EvaluatorConfig(**changes)


def test_status_values_are_stable() -> None:
    statuses = [s.value for s in PartitionStatus]
    assert statuses == ["OK", "WARN", "STOP", "STALL", "REWIND", "LAGGING"]
    assert [s.value for s in GroupStatus] == ["OK", "WARN", "ERR"]


def test_absolute_defaults_are_sized_for_real_time_speech() -> None:
    defaults = EvaluatorConfig()
    assert (defaults.max_time_lag_s, defaults.max_audio_lag_s) == (3.0, 5.0)


def test_windows_stay_young_for_stuck_after_then_leave_it_to_the_window_rules() -> None:
    """LagWindows remembers when it first saw a partition: a window shorter than stuck_after
    does not make an old partition young again."""
    config = dataclasses.replace(CONFIG, window_samples=2, warn_min_samples=2)
    windows = LagWindows(config)
    key = PartitionId("codec.chunks", 0)
    rules = []
    for i in range(5):  # progressing, always 10 records and 20 s behind
        sample = Sample(T0_MS + i * STEP_MS, 100 + i, 110 + i, 10, time_lag_s=20.0)
        windows.observe(key, sample)
        rules.append(windows.evaluate(T0_MS + i * STEP_MS)[key].rule)
    assert rules[:3] == [Rule.TIME_LAG_ABOVE] * 3
    assert rules[3:] == [Rule.NOT_GROWING] * 2


def latest(committed: int | None, lag: int | None) -> Sample:
    end = None if lag is None else (committed or 0) + lag
    return Sample(T0_MS, committed, end, lag)


GROUP_RULE_CASES = [
    ("healthy", "STABLE", 1, [latest(10, 0), latest(5, 2)], True, ()),
    ("not_found_empty_topic", "DEAD", 0, [latest(None, 0)], True, (GroupRule.GROUP_NOT_FOUND,)),
    (
        "not_found_with_waiting_input",
        "DEAD",
        0,
        [latest(None, 4), latest(None, 0)],
        False,
        (GroupRule.GROUP_NOT_FOUND, GroupRule.EMPTY_WITH_LAG),
    ),
    ("dead_but_offsets_kept", "DEAD", 0, [latest(10, 0)], True, ()),
    (
        "empty_with_lag",
        "EMPTY",
        0,
        [latest(10, 0), latest(5, 3)],
        False,
        (GroupRule.EMPTY_WITH_LAG,),
    ),
    ("empty_caught_up", "EMPTY", 0, [latest(10, 0)], True, ()),
    (
        "never_committed_young",
        "STABLE",
        1,
        [latest(None, 76), latest(None, 0)],
        True,
        (GroupRule.NEVER_COMMITTED,),
    ),
    ("never_committed_left_to_the_window_rules", "STABLE", 1, [latest(None, 76)], False, ()),
    (
        "crashed_at_start",
        "EMPTY",
        0,
        [latest(None, 76)],
        True,
        (GroupRule.EMPTY_WITH_LAG, GroupRule.NEVER_COMMITTED),
    ),
    ("never_committed_no_data", "STABLE", 1, [latest(None, 0)], True, ()),
    ("unknown_state_and_members", None, None, [latest(3, 9)], True, ()),
]


@pytest.mark.parametrize(
    ("name", "state", "members", "samples", "young", "expected"),
    GROUP_RULE_CASES,
    ids=[c[0] for c in GROUP_RULE_CASES],
)
def test_group_rules(
    name: str,
    state: str | None,
    members: int | None,
    samples: list[Sample],
    young: bool,
    expected: tuple[GroupRule, ...],
) -> None:
    assert group_rules(state, members, samples, young, CONFIG) == expected


def test_every_group_rule_has_a_case() -> None:
    assert {rule for case in GROUP_RULE_CASES for rule in case[5]} == set(GroupRule)


def test_any_group_rule_makes_the_group_err() -> None:
    assert group_status([PartitionStatus.OK], [GroupRule.EMPTY_WITH_LAG]) is GroupStatus.ERR
    assert group_status([PartitionStatus.OK], []) is GroupStatus.OK


def test_stopped_group_lag_keeps_rising_and_turns_stop() -> None:
    """Regression for Burrow #58/#127: lag must not freeze at the last commit."""
    windows = LagWindows(CONFIG)
    key = PartitionId("codec.chunks", 0)
    verdicts = []
    for i in range(6):
        end = 100 + 25 * (i + 1)  # the talker keeps producing; the consumer committed 100 once
        windows.observe(key, Sample.from_offsets(T0_MS + i * STEP_MS, 100, end))
        verdicts.append(windows.evaluate(T0_MS + i * STEP_MS)[key])
    lags = [s.lag for s in windows.window(key)]
    assert lags == [25, 50, 75, 100, 125, 150]
    assert verdicts[0].status is PartitionStatus.OK  # too early to call
    assert verdicts[-1].status is PartitionStatus.STOP


def test_stop_detected_long_after_the_window_span() -> None:
    """Regression: with fast sampling the window spans less than stuck_after_ms, so idle time
    must be remembered beyond the window or STOP could never fire."""
    config = dataclasses.replace(CONFIG, window_samples=3, warn_min_samples=3)
    windows = LagWindows(config)
    key = PartitionId("codec.chunks", 0)
    for i in range(8):  # 70 s without progress, seen through a 20 s window
        windows.observe(key, Sample.from_offsets(T0_MS + i * STEP_MS, 100, 110 + i))
    now_ms = T0_MS + 7 * STEP_MS
    verdict = windows.evaluate(now_ms)[key]
    assert (verdict.status, verdict.idle_ms) == (PartitionStatus.STOP, 70_000)
    bare = evaluate_partition(windows.window(key), now_ms, config)
    assert bare.status is PartitionStatus.OK  # the window alone only sees 20 s


def test_progress_resets_idle_time() -> None:
    windows = LagWindows(CONFIG)
    key = PartitionId("codec.chunks", 0)
    for i, offset in enumerate([100, 100, 100, 150, 150]):
        windows.observe(key, Sample.from_offsets(T0_MS + i * STEP_MS, offset, offset + 40))
    verdict = windows.evaluate(T0_MS + 4 * STEP_MS)[key]
    assert verdict.idle_ms == STEP_MS  # 150 was first seen one sample ago


def test_window_keeps_order_and_bound() -> None:
    windows = LagWindows(dataclasses.replace(CONFIG, window_samples=3, warn_min_samples=3))
    key = PartitionId("t", 1)
    assert windows.observe(key, Sample.from_offsets(T0_MS, 1, 2))
    assert not windows.observe(key, Sample.from_offsets(T0_MS, 2, 3))  # not newer: refused
    for i in range(1, 6):
        windows.observe(key, Sample.from_offsets(T0_MS + i, i, i + 1))
    assert [s.observed_at_ms for s in windows.window(key)] == [T0_MS + 3, T0_MS + 4, T0_MS + 5]
    assert windows.complete() == 1.0


def test_retain_forgets_partitions_no_longer_measured() -> None:
    windows = LagWindows(CONFIG)
    a, b = PartitionId("t", 0), PartitionId("t", 1)
    windows.observe(a, Sample.from_offsets(T0_MS, 1, 2))
    windows.observe(b, Sample.from_offsets(T0_MS, 1, 2))
    windows.retain([b])
    assert windows.partitions() == [b]
    assert set(windows.evaluate(T0_MS)) == {b}


offsets = st.one_of(st.none(), st.integers(min_value=0, max_value=10_000))


@st.composite
def windows_st(draw: st.DrawFn) -> list[Sample]:
    n = draw(st.integers(min_value=0, max_value=10))
    gaps = draw(st.lists(st.integers(1, 60_000), min_size=n, max_size=n))
    samples, t = [], T0_MS
    for gap in gaps:
        t += gap
        committed = draw(offsets)
        end = draw(offsets)
        owned = draw(st.sampled_from([None, True, False]))
        samples.append(Sample.from_offsets(t, committed, end, owned=owned))
    return samples


@given(windows_st(), st.integers(0, 120_000))
def test_property_status_matches_rule(samples: list[Sample], extra_ms: int) -> None:
    verdict = evaluate_partition(samples, now_after(samples, extra_ms), CONFIG)
    assert verdict.status is RULE_STATUS[verdict.rule]


@given(windows_st(), st.integers(0, 120_000))
def test_property_caught_up_is_ok(samples: list[Sample], extra_ms: int) -> None:
    latest_lag = samples[-1].lag if samples else None
    verdict = evaluate_partition(samples, now_after(samples, extra_ms), CONFIG)
    if latest_lag is not None and latest_lag <= CONFIG.allowed_lag:
        assert verdict.status is PartitionStatus.OK


@given(windows_st(), st.integers(0, 120_000))
def test_property_monotonic_offsets_never_rewind(samples: list[Sample], extra_ms: int) -> None:
    running = 0
    monotonic = []
    for s in samples:  # force the committed offsets to be non-decreasing
        running = max(running, s.committed_offset or 0)
        monotonic.append(dataclasses.replace(s, committed_offset=running))
    verdict = evaluate_partition(monotonic, now_after(monotonic, extra_ms), CONFIG)
    assert verdict.status is not PartitionStatus.REWIND


@given(windows_st(), st.integers(0, 120_000))
def test_property_recently_caught_up_never_stop_stall_or_warn(
    samples: list[Sample], extra_ms: int
) -> None:
    verdict = evaluate_partition(samples, now_after(samples, extra_ms), CONFIG)
    if any(s.lag is not None and s.lag <= CONFIG.allowed_lag for s in samples):
        # LAGGING judges the latest time and audio lag only (absent here, from offsets alone)
        assert verdict.status in {PartitionStatus.OK, PartitionStatus.REWIND}


@given(st.lists(st.sampled_from(list(PartitionStatus)), max_size=20))
def test_property_group_is_worst_partition(statuses: list[PartitionStatus]) -> None:
    errors = {
        PartitionStatus.STOP,
        PartitionStatus.STALL,
        PartitionStatus.REWIND,
        PartitionStatus.LAGGING,
    }
    result = group_status(statuses)
    if errors & set(statuses):
        assert result is GroupStatus.ERR
    elif PartitionStatus.WARN in statuses:
        assert result is GroupStatus.WARN
    else:
        assert result is GroupStatus.OK
