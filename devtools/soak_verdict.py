"""The soak's judgement: growth fitted over the samples, lag by quarter, the verdict, its tables
and its last line. Pure functions of the samples (docs/soak.md, "The verdict")."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence

from codeclog.devtools.soak_samples import LagPoint, ProcessSample, Sample
from codeclog.devtools.stats import percentile

GROWTH_LIMIT_PCT = 5.0
MIN_COUNT_RISE = 3  # fds and threads: a fitted rise of fewer is a reconnect, not a leak
MIN_FIT_SAMPLES = 3
MIN_FIT_SHARE = 0.25  # of the second half: a fit spans at least this much of it
RESTART_WARMUP_S = 300.0  # a restarted process is fitted from this long after its restart
NODE_RESTART_WARMUP_S = 600.0  # a restarted broker node: its connections come back in steps
LAG_CREEP_S = 0.5
LAG_CREEP_RATIO = 0.25
FAULT_SETTLE_S = 60.0
METRICS = ("rss_bytes", "fds", "threads")
OK, DRIFT, FAIL = "OK", "DRIFT", "FAIL"
MB = 1_000_000


def slope(times: Sequence[float], values: Sequence[float]) -> float:
    """The Theil-Sen slope of values over times: the median of the slopes between every two
    samples (0 when the times do not vary). Fitted over all the samples, as a least-squares
    line is, but a dip or a spike that lasts under a quarter of them (a reconnect's sockets
    closed for a few minutes, a fault's stuck handle) leaves it where the rest put it."""
    pairs = [
        (values[j] - values[i]) / (times[j] - times[i])
        for i in range(len(times))
        for j in range(i + 1, len(times))
        if times[j] != times[i]
    ]
    return statistics.median(pairs) if pairs else 0.0


def fitted_rise(times: Sequence[float], values: Sequence[float]) -> tuple[float, float] | None:
    """How much the line fitted through the samples (`slope`, through the median of the
    values less the slope's part) rises from the first time to the last: (in percent of its
    value at the first, in the values' unit); None with fewer than MIN_FIT_SAMPLES samples or
    nothing to compare against (a line at or below 0 where it starts, and a median of 0)."""
    if len(times) < MIN_FIT_SAMPLES or times[-1] <= times[0]:
        return None
    per_s = slope(times, values)
    offsets = zip(times, values, strict=True)
    level = statistics.median(v - per_s * (t - times[0]) for t, v in offsets)
    base = level if level > 0 else statistics.median(values)
    if base <= 0:
        return None
    rise = per_s * (times[-1] - times[0])
    return rise / base * 100.0, rise


def growth_percent(times: Sequence[float], values: Sequence[float]) -> float | None:
    """`fitted_rise` in percent."""
    fitted = fitted_rise(times, values)
    return None if fitted is None else fitted[0]


@dataclasses.dataclass(frozen=True, slots=True)
class Growth:
    """One process's growth of one figure over the second half (percent None: not fitted)."""

    role: str
    metric: str
    percent: float | None
    samples: int
    note: str = ""
    rise: float = 0.0  # the fitted rise over the half, in the figure's unit
    judged: bool = True  # False: sampled and shown, never a reason for the verdict (tooling)

    @property
    def drifts(self) -> bool:
        """More than GROWTH_LIMIT_PCT, and for a count (fds, threads) at least MIN_COUNT_RISE."""
        if not self.judged or self.percent is None or self.percent <= GROWTH_LIMIT_PCT:
            return False
        return self.metric == "rss_bytes" or self.rise >= MIN_COUNT_RISE


def last_incarnation(
    samples: Sequence[Sample], role: str
) -> tuple[list[tuple[float, ProcessSample]], float | None]:
    """The samples of `role`'s last process (the trailing run of one pid), and when it was
    first seen if an earlier process of the role was seen before it (a restart), else None."""
    present = [(s.at_s, p) for s in samples if (p := s.processes.get(role)) is not None]
    if not present:
        return [], None
    pid = present[-1][1].pid
    start = len(present)
    while start > 0 and present[start - 1][1].pid == pid:
        start -= 1
    mine = present[start:]
    return mine, mine[0][0] if start > 0 else None


def restart_warmup_s(role: str) -> float:
    """How long after its restart a process is still warming up. A member or a listener: its
    own (torch, allocators), RESTART_WARMUP_S. A broker node ("node-N"): NODE_RESTART_WARMUP_S.
    A node's open fds are mostly its clients' and peers' connections (its log segments hold a
    few dozen, fixed), and after a restart they come back in steps, not at once, as its
    leaderships return (the preferred-leader election runs every 300 s,
    `leader.imbalance.check.interval.seconds`) and the clients follow them. A restarted node
    sits 15-35 fds below its level for 4 to 10 minutes, then steps up to it (for example
    147-149 for 5 minutes, 156-160 for 5 more, then 185-195; BENCHMARKS.md has the soak runs);
    fitted from 5 minutes after the restart, such a node read +8.2 %."""
    return NODE_RESTART_WARMUP_S if role.startswith("node-") else RESTART_WARMUP_S


def fit_window(
    samples: Sequence[Sample], role: str, duration_s: float, filling_s: float = 0.0
) -> tuple[float, str]:
    """Where `role`'s fit starts: the second half of the run; not before `filling_s` (a
    working set that fills by design for that long: the listeners remember ten minutes of
    ended streams); for a process restarted during the run, no sooner than its
    `restart_warmup_s` after its restart (its own warm-up is no leak). And the note that says
    why, if not the half."""
    _, restarted = last_incarnation(samples, role)
    since, notes = duration_s / 2, []
    if filling_s > since:
        since = filling_s
        notes.append(f"fills its working set for {filling_s / 60:g} min")
    if restarted is not None:
        since = max(since, restarted + restart_warmup_s(role))
        notes.append(f"restarted at {restarted / 60:.1f} min")
    return since, "; ".join(notes)


def growths(
    samples: Sequence[Sample],
    duration_s: float,
    judged: Callable[[str], bool] = lambda role: True,
    filling: Callable[[str], float] = lambda role: 0.0,
) -> list[Growth]:
    """Every process's growth of each figure (METRICS) over the second half of the run (its
    last process's, from `fit_window`, `filling(role)` the seconds its working set fills by
    design); a role that `judged` refuses is fitted and shown, never judged. A fit needs
    MIN_FIT_SAMPLES samples over at least MIN_FIT_SHARE of the half."""
    roles = list(dict.fromkeys(role for s in samples for role in s.processes))
    result = []
    for role in roles:
        last, _ = last_incarnation(samples, role)
        since, note = fit_window(samples, role, duration_s, filling(role))
        mine = [(t, p) for t, p in last if t >= since]
        span = mine[-1][0] - mine[0][0] if mine else 0.0
        fitted = len(mine) >= MIN_FIT_SAMPLES and span >= MIN_FIT_SHARE * duration_s / 2
        if not last:
            note = "not running"
        elif not fitted:
            note = f"{note}: too little left to fit" if note else "too few samples to fit"
        times = [t for t, _ in mine]
        for metric in METRICS:
            values = [float(getattr(p, metric)) for _, p in mine]
            rise = fitted_rise(times, values) if fitted else None
            percent, amount = (None, 0.0) if rise is None else rise
            result.append(Growth(role, metric, percent, len(mine), note, amount, judged(role)))
    return result


def worst(found: Sequence[Growth], metric: str) -> Growth | None:
    """The fastest-growing judged process of `metric` (fitted ones only)."""
    fitted = [g for g in found if g.metric == metric and g.percent is not None and g.judged]
    return max(fitted, key=lambda g: g.percent or 0.0, default=None)


def calm(at_s: float, faults: Sequence[tuple[float, float]]) -> bool:
    """Outside every fault (start, end) and the FAULT_SETTLE_S after it."""
    return not any(start <= at_s <= end + FAULT_SETTLE_S for start, end in faults)


def quarter_p99(
    points: Sequence[LagPoint], duration_s: float, faults: Sequence[tuple[float, float]] = ()
) -> list[float]:
    """The p99 of the group's time lag in each quarter of the run, calm points only (NaN for a
    quarter without any)."""
    quarters: list[list[float]] = [[], [], [], []]
    for point in points:
        if point.lag_s is None or not calm(point.at_s, faults) or duration_s <= 0:
            continue
        index = min(3, max(0, int(4 * point.at_s / duration_s)))
        quarters[index].append(point.lag_s)
    return [percentile(q, 99) for q in quarters]


def lag_creeps(second: float, last: float) -> bool:
    """The last quarter's p99 worse than the second's beyond the tolerance (NaN: unknown,
    not a creep)."""
    if math.isnan(second) or math.isnan(last):
        return False
    return last > second + max(LAG_CREEP_S, LAG_CREEP_RATIO * second)


@dataclasses.dataclass
class Correctness:
    """What the checks after the run found (FAIL when anything is not zero or empty)."""

    lost: int = 0
    duplicated: int = 0
    anomalies: dict[str, int] = dataclasses.field(default_factory=dict)  # kind -> count
    failures: list[str] = dataclasses.field(default_factory=list)  # what else went wrong

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or any(self.anomalies.values()) or self.failures)


def verdict(
    correct: Correctness, found: Sequence[Growth], quarters: Sequence[float]
) -> tuple[str, list[str]]:
    """OK, DRIFT or FAIL, and the reasons for anything but OK (docs/soak.md, "The verdict").

    FAIL: something was lost, written twice or read wrong: the talker's lost records, windows
    `verify` expected and did not find (or found twice), the audit's duplicates, any finding of
    the history checker, a dead letter, a listener whose later copy differed, a member that
    exited on its own, or a fault the harness could not inject. DRIFT: nothing wrong yet, but
    over the second half a process's resident size, open fds or threads grow by more than
    GROWTH_LIMIT_PCT (`growths`; for fds and threads also by at least MIN_COUNT_RISE of them),
    or the group's lag p99 in the last quarter is worse than in the second by more than
    LAG_CREEP_S or LAG_CREEP_RATIO of it, whichever is larger (`lag_creeps`; lag measured while
    a fault and the FAULT_SETTLE_S after it run is left out of both). OK: neither."""
    reasons = []
    if correct.lost:
        reasons.append(f"{correct.lost} lost")
    if correct.duplicated:
        reasons.append(f"{correct.duplicated} duplicated")
    reasons += [f"{kind} {n}" for kind, n in correct.anomalies.items() if n]
    reasons += correct.failures
    if reasons:
        return FAIL, reasons
    reasons = [
        f"{g.role} {g.metric} +{g.percent:.1f}% over the second half" for g in found if g.drifts
    ]
    if len(quarters) == 4 and lag_creeps(quarters[1], quarters[3]):
        reasons.append(
            f"lag p99 {quarters[3]:.2f} s in the last quarter, {quarters[1]:.2f} s in the second"
        )
    return (DRIFT, reasons) if reasons else (OK, [])


def total_fds(sample: Sample) -> int:
    return sum(p.fds for p in sample.processes.values() if p is not None)


def verdict_line(
    minutes: float,
    faults: int,
    correct: Correctness,
    found: Sequence[Growth],
    samples: Sequence[Sample],
    lag_p99_s: float,
    word: str,
) -> str:
    """The soak's last line (the format docs/soak.md shows)."""
    rss = worst(found, "rss_bytes")
    growth = "n/a" if rss is None or rss.percent is None else f"{rss.percent:.1f}%"
    who = rss.role if rss is not None else "none fitted"
    fds = f"{total_fds(samples[0])} -> {total_fds(samples[-1])}" if samples else "n/a"
    return (
        f"soak {minutes:g} min, {faults} faults: {correct.lost} lost, {correct.duplicated} "
        f"duplicated; RSS growth {growth} (worst: {who}), fds {fds}, lag p99 "
        f"{_num(lag_p99_s, 2)} s; verdict {word}"
    )


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _mb(sample: ProcessSample | None) -> str:
    return "-" if sample is None else f"{sample.rss_bytes / MB:.0f}"


def process_table(samples: Sequence[Sample], found: Sequence[Growth]) -> str:
    """Per process: RSS at the first, middle and last sample, fds and threads first -> last,
    the growth of each over the second half (the verdict's figures), and the librdkafka
    handles it held first, at most and last."""
    lines = [
        "| process | RSS MB first / mid / last | RSS | fds first -> last | fds | threads first "
        "-> last | threads | Kafka handles first / most / last | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    by_role = {(g.role, g.metric): g for g in found}
    roles = list(dict.fromkeys(role for s in samples for role in s.processes))
    mid = samples[len(samples) // 2] if samples else None
    for role in roles:
        seen = [p for s in samples if (p := s.processes.get(role)) is not None]
        first, last = (seen[0], seen[-1]) if seen else (None, None)
        middle = mid.processes.get(role) if mid is not None else None
        cells = [f"{_mb(first)} / {_mb(middle)} / {_mb(last)}"]
        for metric in METRICS:
            g = by_role.get((role, metric))
            cell = "-" if g is None or g.percent is None else f"{g.percent:+.1f}%"
            if metric != "rss_bytes":
                a = "-" if first is None else getattr(first, metric)
                b = "-" if last is None else getattr(last, metric)
                cells.append(f"{a} -> {b}")
            cells.append(cell)
        handles = [p.kafka_handles for p in seen]
        cells.append(f"{handles[0]} / {max(handles)} / {handles[-1]}" if handles else "-")
        rss = by_role.get((role, "rss_bytes"))
        note = "" if rss is None else rss.note or ("" if rss.judged else "not judged: tooling")
        lines.append(f"| {role} | {' | '.join(cells)} | {note} |")
    return "\n".join(lines)


def time_table(samples: Sequence[Sample], members: Sequence[str]) -> str:
    """One row per sample: the group's lag, windows/s, each member's open streams and fold
    state, and every process's resident size."""
    roles = list(dict.fromkeys(role for s in samples for role in s.processes))
    member_cols = [f"{m} streams / fold KB" for m in members]
    head = ["min", "lag rec", "lag s", "audio lag s", "windows/s", *member_cols]
    head += [f"{role} MB" for role in roles]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for s in samples:
        row = [
            f"{s.at_s / 60:.1f}",
            "-" if s.lag_records is None else str(s.lag_records),
            _num(s.lag_s),
            _num(s.audio_lag_s),
            _num(s.windows_per_s),
        ]
        for m in members:
            figures = s.members.get(m, {})
            streams = figures.get("open_streams")
            fold = figures.get("fold_state_bytes")
            row.append(
                f"{'-' if streams is None else f'{streams:.0f}'} / "
                f"{'-' if fold is None else f'{fold / 1000:.0f}'}"
            )
        row += [_mb(s.processes.get(role)) for role in roles]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def lag_table(quarters: Sequence[float], whole_p99: float) -> str:
    """The group's time lag p99 per quarter (calm points) and over the whole run."""
    cells = " | ".join(_num(q, 2) for q in quarters)
    return (
        "| lag p99 s | quarter 1 | quarter 2 | quarter 3 | quarter 4 | whole run, faults "
        "included |\n"
        f"|---|---:|---:|---:|---:|---:|\n| calm | {cells} | {_num(whole_p99, 2)} |"
    )


def as_faults(raw: Sequence[Mapping[str, float]]) -> list[tuple[float, float]]:
    """(start, end) of each fault from the soak's fault records."""
    return [(float(f["at_s"]), float(f["end_s"])) for f in raw]
