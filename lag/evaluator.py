"""Consumer-lag status rules: a pure evaluator over a sliding window of samples per partition.
The rules and why: docs/lag.md, "Partition rules" and "Group rules"."""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence

from codeclog.errors import UsageError


class LagConfigError(UsageError):
    """An evaluator setting is out of range."""


class PartitionStatus(enum.Enum):
    """Per-partition status; values are stable (metric labels, JSON, exit codes)."""

    OK = "OK"
    WARN = "WARN"  # making progress, but falling further behind
    STOP = "STOP"  # no progress for some time, lag non-zero, nobody holds the partition
    STALL = "STALL"  # a live member holds the partition but the offset does not move
    REWIND = "REWIND"  # the committed offset went backwards and has not recovered
    LAGGING = "LAGGING"  # young window: time or audio lag above its absolute threshold


class GroupStatus(enum.Enum):
    """Per-group status: the worst partition status, STOP/STALL/REWIND clamped to ERR."""

    OK = "OK"
    WARN = "WARN"
    ERR = "ERR"


class Rule(enum.Enum):
    """The rule that decided a partition's status (docs/lag.md, "Partition rules")."""

    NO_DATA = "no_data"
    WITHIN_ALLOWED_LAG = "within_allowed_lag"
    STOP = "stop"
    REWIND = "rewind"
    LAG_WAS_ZERO = "lag_was_zero"
    STALL = "stall"
    GROWING = "growing"
    NOT_GROWING = "not_growing"
    TIME_LAG_ABOVE = "time_lag_above"
    AUDIO_LAG_ABOVE = "audio_lag_above"


class GroupRule(enum.Enum):
    """A group-level finding (docs/lag.md, "Group rules"); any of them makes the group ERR."""

    GROUP_NOT_FOUND = "group_not_found"
    EMPTY_WITH_LAG = "empty_with_lag"
    NEVER_COMMITTED = "never_committed"


RULE_STATUS: Mapping[Rule, PartitionStatus] = {
    Rule.NO_DATA: PartitionStatus.OK,
    Rule.WITHIN_ALLOWED_LAG: PartitionStatus.OK,
    Rule.STOP: PartitionStatus.STOP,
    Rule.REWIND: PartitionStatus.REWIND,
    Rule.LAG_WAS_ZERO: PartitionStatus.OK,
    Rule.STALL: PartitionStatus.STALL,
    Rule.GROWING: PartitionStatus.WARN,
    Rule.NOT_GROWING: PartitionStatus.OK,
    Rule.TIME_LAG_ABOVE: PartitionStatus.LAGGING,
    Rule.AUDIO_LAG_ABOVE: PartitionStatus.LAGGING,
}

_GROUP_OF: Mapping[PartitionStatus, GroupStatus] = {
    PartitionStatus.OK: GroupStatus.OK,
    PartitionStatus.WARN: GroupStatus.WARN,
    PartitionStatus.STOP: GroupStatus.ERR,
    PartitionStatus.STALL: GroupStatus.ERR,
    PartitionStatus.REWIND: GroupStatus.ERR,
    PartitionStatus.LAGGING: GroupStatus.ERR,
}
_GROUP_RANK: Mapping[GroupStatus, int] = {
    GroupStatus.OK: 0,
    GroupStatus.WARN: 1,
    GroupStatus.ERR: 2,
}


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class PartitionId:
    """A topic partition (named so it does not shadow confluent_kafka.TopicPartition)."""

    topic: str
    partition: int


def offset_lag(committed_offset: int | None, end_offset: int | None) -> int | None:
    """End offset minus committed offset, clamped at 0 (Burrow, C.1); None when either is."""
    if committed_offset is None or end_offset is None:
        return None
    return max(0, end_offset - committed_offset)


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    """One observation of a partition. Unknown values are None, never NaN."""

    observed_at_ms: int  # the monitor's clock when the offsets were read (Unix ms)
    committed_offset: int | None  # the group's committed offset (next to consume); None: none
    end_offset: int | None  # the last stable offset (LSO) for read_committed consumers
    # records the consumer still has to read: normally end - committed, but lag.arithmetic lowers
    # it to the visible records when only commit markers / aborted records remain (else a
    # consumer that committed just before stepping over a marker would show lag 1 forever)
    lag: int | None
    time_lag_s: float | None = None  # age of the record at the committed offset
    audio_lag_s: float | None = None  # seconds of codec frames not yet vocoded (estimate)
    owned: bool | None = None  # a live group member holds the partition; None: unknown

    @classmethod
    def from_offsets(
        cls,
        observed_at_ms: int,
        committed_offset: int | None,
        end_offset: int | None,
        *,
        owned: bool | None = None,
    ) -> Sample:
        """A sample whose lag is the plain offset lag."""
        lag = offset_lag(committed_offset, end_offset)
        return cls(observed_at_ms, committed_offset, end_offset, lag, owned=owned)


@dataclasses.dataclass(frozen=True, slots=True)
class EvaluatorConfig:
    """Evaluator thresholds. Defaults suit a sampler running every few seconds."""

    window_samples: int = 10  # samples kept per partition (Burrow `intervals`)
    allowed_lag: int = 0  # lag at or below this is OK (Burrow `allowed-lag`)
    stuck_after_ms: int = 30_000  # no progress for this long (with lag) is STOP or STALL
    warn_growth_records: int = 100  # WARN needs the lag to grow by more than this over the window
    warn_min_samples: int = 5  # ... seen over at least this many samples
    # absolute thresholds for young windows (and one-shot checks): docs/lag.md, "Partition rules"
    max_time_lag_s: float = 3.0
    max_audio_lag_s: float = 5.0

    def __post_init__(self) -> None:
        if self.window_samples < 2:
            raise LagConfigError(f"window_samples must be >= 2, got {self.window_samples}")
        if self.allowed_lag < 0 or self.stuck_after_ms < 0 or self.warn_growth_records < 0:
            raise LagConfigError("allowed_lag, stuck_after_ms and warn_growth_records must be >= 0")
        if not (self.max_time_lag_s >= 0 and self.max_audio_lag_s >= 0):
            raise LagConfigError(
                f"max_time_lag_s and max_audio_lag_s must be >= 0, got "
                f"{self.max_time_lag_s:g} and {self.max_audio_lag_s:g}"
            )
        if not 2 <= self.warn_min_samples <= self.window_samples:
            raise LagConfigError(
                f"warn_min_samples must be in 2..window_samples ({self.window_samples}), "
                f"got {self.warn_min_samples}"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """A partition's status and the rule that decided it."""

    status: PartitionStatus
    rule: Rule
    # time since the committed offset last changed; None when not needed (no data, caught up)
    idle_ms: int | None


def _verdict(rule: Rule, idle_ms: int | None) -> Verdict:
    return Verdict(RULE_STATUS[rule], rule, idle_ms)


_NO_DATA = _verdict(Rule.NO_DATA, None)
_CAUGHT_UP = _verdict(Rule.WITHIN_ALLOWED_LAG, None)


def idle_since_ms(window: Sequence[Sample]) -> int:
    """When the latest committed offset was first observed (the window start if always)."""
    current = window[-1].committed_offset
    since = window[-1].observed_at_ms
    for sample in reversed(window):
        if sample.committed_offset != current:
            break
        since = sample.observed_at_ms
    return since


def is_rewound(window: Sequence[Sample]) -> bool:
    """Burrow's REWIND: an offset dropped and the consumer never got back above it."""
    offsets = [s.committed_offset for s in window if s.committed_offset is not None]
    return bool(offsets) and offsets[-1] < max(offsets)


def lag_trend(times_ms: Sequence[int], lags: Sequence[int]) -> float:
    """Least-squares slope of lag over time (records per ms); 0.0 when undefined."""
    mean_t = sum(times_ms) / len(times_ms)
    deviations = [t - mean_t for t in times_ms]
    spread = sum([d * d for d in deviations])
    if spread == 0:
        return 0.0
    # sum(d * (lag - mean_lag)) == sum(d * lag) because the deviations sum to zero
    return sum([d * lag for d, lag in zip(deviations, lags, strict=True)]) / spread


def is_growing(window: Sequence[Sample], config: EvaluatorConfig) -> bool:
    """Sustained growth: enough samples, growth above the threshold, positive trend."""
    lags = [lag for s in window if (lag := s.lag) is not None]
    if len(lags) < config.warn_min_samples:
        return False
    if lags[-1] - lags[0] <= config.warn_growth_records:
        return False
    return lag_trend([s.observed_at_ms for s in window if s.lag is not None], lags) > 0


def above_threshold(sample: Sample, config: EvaluatorConfig) -> Rule | None:
    """The absolute rule a sample breaks (time lag first), or None."""
    if sample.time_lag_s is not None and sample.time_lag_s > config.max_time_lag_s:
        return Rule.TIME_LAG_ABOVE
    if sample.audio_lag_s is not None and sample.audio_lag_s > config.max_audio_lag_s:
        return Rule.AUDIO_LAG_ABOVE
    return None


def evaluate_partition(
    window: Sequence[Sample],
    now_ms: int,
    config: EvaluatorConfig,
    offset_seen_since_ms: int | None = None,
    first_seen_ms: int | None = None,
) -> Verdict:
    """The status of one partition from its window (oldest sample first) at `now_ms`.

    `offset_seen_since_ms` is when the latest committed offset was first observed, if known
    from before the window (LagWindows tracks it); otherwise the window alone bounds it, and
    idle time can never exceed the window's span. `first_seen_ms` is when the partition was
    first observed (LagWindows tracks it; else the window's oldest sample): the window is young
    until `stuck_after_ms` after it.
    """
    if not window or (lag := window[-1].lag) is None:
        return _NO_DATA
    if lag <= config.allowed_lag:
        return _CAUGHT_UP  # the common case: kept cheap, idle time is irrelevant here
    since_ms = offset_seen_since_ms
    if since_ms is None:
        since_ms = idle_since_ms(window)
    idle_ms = now_ms - since_ms
    known_lags = [s.lag for s in window if s.lag is not None]
    caught_up = min(known_lags) <= config.allowed_lag
    stuck = idle_ms >= config.stuck_after_ms
    if stuck and not caught_up and window[-1].owned is not True:
        return _verdict(Rule.STOP, idle_ms)
    if is_rewound(window):
        return _verdict(Rule.REWIND, idle_ms)
    first_ms = window[0].observed_at_ms if first_seen_ms is None else first_seen_ms
    if now_ms - first_ms < config.stuck_after_ms and (rule := above_threshold(window[-1], config)):
        return _verdict(rule, idle_ms)
    if caught_up:
        return _verdict(Rule.LAG_WAS_ZERO, idle_ms)
    if stuck:
        return _verdict(Rule.STALL, idle_ms)
    if is_growing(window, config):
        return _verdict(Rule.GROWING, idle_ms)
    return _verdict(Rule.NOT_GROWING, idle_ms)


def group_rules(
    state: str | None,
    member_count: int | None,
    samples: Sequence[Sample],
    young: bool,
    config: EvaluatorConfig,
) -> tuple[GroupRule, ...]:
    """The group rules that hold for the latest sample of every partition of the topic.

    `state` is the consumer group state name (None: unknown, e.g. a cluster that cannot describe
    groups); `young`: the group has been observed for less than `stuck_after_ms`.
    """
    never_committed = all(s.committed_offset is None for s in samples)
    lagging = any(s.lag is not None and s.lag > config.allowed_lag for s in samples)
    rules: list[GroupRule] = []
    if state == "DEAD" and never_committed:
        rules.append(GroupRule.GROUP_NOT_FOUND)
    if member_count == 0 and lagging:
        rules.append(GroupRule.EMPTY_WITH_LAG)
    if young and never_committed and lagging:
        rules.append(GroupRule.NEVER_COMMITTED)
    return tuple(rules)


def group_status(
    statuses: Iterable[PartitionStatus], rules: Iterable[GroupRule] = ()
) -> GroupStatus:
    """The worst partition status, STOP/STALL/REWIND/LAGGING clamped to ERR; ERR on any rule."""
    if any(True for _ in rules):
        return GroupStatus.ERR
    worst = GroupStatus.OK
    for status in statuses:
        candidate = _GROUP_OF[status]
        if _GROUP_RANK[candidate] > _GROUP_RANK[worst]:
            worst = candidate
    return worst


class LagWindows:
    """The explicit state of the evaluator: a bounded window of samples per partition.

    `observe` appends, `retain` forgets partitions no longer measured (so a partition that left
    the topic or the group cannot alert forever, vectordotdev/vector #24647), `evaluate` is pure.
    """

    def __init__(self, config: EvaluatorConfig) -> None:
        self.config = config
        self._windows: dict[PartitionId, collections.deque[Sample]] = {}
        # when each partition's current committed offset was first observed; kept apart from
        # the window because a stopped consumer's offset outlives any window of samples
        self._offset_seen_since_ms: dict[PartitionId, int] = {}
        self._first_seen_ms: dict[PartitionId, int] = {}  # the window is young until stuck_after

    def observe(self, key: PartitionId, sample: Sample) -> bool:
        """Append a sample; False (and ignored) when it is not newer than the last one.

        A wall clock may step back (NTP); dropping the sample keeps the window ordered without
        taking the exporter down.
        """
        window = self._windows.get(key)
        if window is None:
            window = collections.deque(maxlen=self.config.window_samples)
            self._windows[key] = window
        if window and sample.observed_at_ms <= window[-1].observed_at_ms:
            return False
        if not window or window[-1].committed_offset != sample.committed_offset:
            self._offset_seen_since_ms[key] = sample.observed_at_ms
        self._first_seen_ms.setdefault(key, sample.observed_at_ms)
        window.append(sample)
        return True

    def retain(self, keys: Iterable[PartitionId]) -> None:
        keep = set(keys)
        for key in [k for k in self._windows if k not in keep]:
            del self._windows[key]
            self._offset_seen_since_ms.pop(key, None)
            self._first_seen_ms.pop(key, None)

    def window(self, key: PartitionId) -> tuple[Sample, ...]:
        return tuple(self._windows.get(key, ()))

    def partitions(self) -> list[PartitionId]:
        return sorted(self._windows)

    def complete(self) -> float:
        """Fraction of partitions whose window is full (Burrow's `complete`); 0.0 when none."""
        if not self._windows:
            return 0.0
        full = sum(1 for w in self._windows.values() if len(w) == self.config.window_samples)
        return full / len(self._windows)

    def evaluate(self, now_ms: int) -> dict[PartitionId, Verdict]:
        since, first = self._offset_seen_since_ms, self._first_seen_ms
        return {
            key: evaluate_partition(window, now_ms, self.config, since.get(key), first.get(key))
            for key, window in self._windows.items()
        }
