"""The soak's pure parts (issue 43; `python -m bench.soak` runs them on a live cluster): the
readers of /proc and of Prometheus pages, the slope fit, the growth over the second half, the
lag quarters, the fault plan, the verdict and its line. No soak runs here: the harness is
checked by running it (docs/soak.md)."""

from __future__ import annotations

import itertools
import math
import os
import random
import socket
import sys
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codeclog.devtools import soak_samples
from codeclog.devtools.soak_plan import FAULT_ROOM_S, fault_plan
from codeclog.devtools.soak_samples import (
    MEMBER_METRICS,
    Counter,
    LagPoint,
    ProcessSample,
    Sample,
    exporter_lag,
    kafka_handles,
    listener_progress,
    member_figures,
    metric_values,
    parse_status,
    sample_process,
    windows_rate,
)
from codeclog.devtools.soak_verdict import (
    DRIFT,
    FAIL,
    OK,
    Correctness,
    Growth,
    growth_percent,
    growths,
    lag_creeps,
    process_table,
    quarter_p99,
    restart_warmup_s,
    slope,
    time_table,
    verdict,
    verdict_line,
)
from tests.processes import run_in_tree

STATUS = """Name:\tpython
State:\tS (sleeping)
VmPeak:\t 1234567 kB
VmRSS:\t  645120 kB
RssAnon:\t  600000 kB
Threads:\t17
"""


def test_status_gives_the_resident_size_in_bytes_and_the_threads() -> None:
    assert parse_status(STATUS) == (645120 * 1024, 17)
    assert parse_status("Name:\tkworker\nThreads:\t1\n") == (0, 1)  # no VmRSS: a kernel thread


def test_this_process_is_sampled_and_a_gone_one_is_none() -> None:
    me = sample_process(os.getpid())
    assert me is not None and me.pid == os.getpid()
    assert me.rss_bytes > 1_000_000 and me.threads >= 1 and me.fds >= 3
    assert sample_process(None) is None
    assert sample_process(2**22 + 12345) is None  # above pid_max's default: no such process


HANDLES_CHILD = """
import gc, os
from confluent_kafka import Producer
from codeclog.devtools.soak_samples import kafka_handles, sample_process
before = kafka_handles(os.getpid())
producers = [Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0}) for _ in range(2)]
sample = sample_process(os.getpid())
made = sample.kafka_handles if sample is not None else -1
producers.clear()
gc.collect()
print(before, made, kafka_handles(os.getpid()), kafka_handles(2**22 + 12345))
"""


def test_each_librdkafka_handle_alive_is_counted_and_a_destroyed_one_is_not() -> None:
    """The soak's leak finder for the issue's "handles replaced and never destroyed". In a
    fresh interpreter: the test session's own handles (other tests', closed in the background)
    would come and go meanwhile."""
    done = run_in_tree([sys.executable, "-c", HANDLES_CHILD], timeout_s=60)
    assert done.returncode == 0, done.stderr
    before, made, after, no_such_process = map(int, done.stdout.split())
    assert (before, made, after, no_such_process) == (0, 2, 0, 0)


def test_a_thread_that_carries_its_creators_name_for_a_moment_is_not_a_handle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker thread starts with its creator's name "rdk:main" and names itself a moment
    later: a reading taken in that moment counted 3 handles for 2 (CI at stop 48)."""
    tasks = tmp_path / "77" / "task"
    for tid, name in (("77", "python"), ("78", "rdk:main"), ("79", "rdk:main"), ("80", "rdk:main")):
        (tasks / tid).mkdir(parents=True)
        (tasks / tid / "comm").write_text(name + "\n")

    def the_new_thread_names_itself(seconds: float) -> None:
        (tasks / "80" / "comm").write_text("rdk:broker-1\n")

    monkeypatch.setattr(soak_samples.time, "sleep", the_new_thread_names_itself)
    assert kafka_handles(77, tmp_path) == 2
    assert kafka_handles(78, tmp_path) == 0  # no such process


PAGE = """# HELP codeclog_vocoder_windows_total Decode windows vocoded
# TYPE codeclog_vocoder_windows_total counter
codeclog_vocoder_windows_total 1234.0
codeclog_vocoder_windows_created 1.7e9
codeclog_vocoder_open_streams 3.0
codeclog_vocoder_rejections_total{reason="evicted"} 2.0
codeclog_vocoder_rejections_total{reason="undecodable_record"} 1.0
codeclog_vocoder_rtf NaN
"""


def test_a_prometheus_page_sums_the_label_sets_of_a_name_and_skips_nan() -> None:
    values = metric_values(PAGE)
    assert values["codeclog_vocoder_windows_total"] == 1234.0
    assert values["codeclog_vocoder_rejections_total"] == 3.0
    assert "codeclog_vocoder_rtf" not in values
    assert member_figures(values) == {"windows": 1234.0, "open_streams": 3.0}


def test_the_member_serves_every_figure_the_soak_reads() -> None:
    """The names in MEMBER_METRICS are the ones `vocode --metrics-port` serves."""
    from codeclog.consumers.member.metrics import VocoderMetrics

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    metrics = VocoderMetrics.create(port)
    metrics.windows.inc(5)
    metrics.fold_state_bytes.set(1000)
    metrics.fold_requests.set(7)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
        served = member_figures(metric_values(page.read().decode()))
    assert set(served) == set(MEMBER_METRICS)
    assert served["windows"] == 5 and served["fold_state_bytes"] == 1000


def test_the_groups_lag_is_read_from_the_exporters_page() -> None:
    page = """kafka_consumergroup_group_sum_lag{cluster_name="c",group="g"} 14.0
kafka_consumergroup_group_max_lag_seconds{cluster_name="c",group="g"} 0.6
codeclog_audio_lag_seconds{cluster_name="c",group="g",topic="t",partition="0"} 0.4
codeclog_audio_lag_seconds{cluster_name="c",group="g",topic="t",partition="1"} 0.5
"""
    assert exporter_lag(5.0, metric_values(page)) == LagPoint(5.0, 14, 0.6, pytest.approx(0.9))
    assert exporter_lag(5.0, None) == LagPoint(5.0, None, None, None)  # no page: unknown
    gone = metric_values("kafka_consumergroup_group_sum_lag 3\n")  # the rest dropped: a failure
    assert exporter_lag(5.0, gone) == LagPoint(5.0, 3, None, None)


def test_windows_per_second_counts_a_restarted_member_from_zero() -> None:
    before = {"a": Counter(0.0, 11, 100.0), "b": Counter(0.0, 12, 50.0)}
    now = {"a": Counter(60.0, 11, 400.0), "b": Counter(60.0, 99, 60.0)}  # b restarted
    assert windows_rate(before, now) == pytest.approx((300 + 60) / 60)
    assert windows_rate({}, now) is None
    assert windows_rate(before, {"a": Counter(0.0, 11, 100.0)}) is None


def test_the_listeners_newest_progress_line_is_read() -> None:
    text = (
        "\r[listen] speculative: 10 windows played, 2 streams open, 0 later copies dropped, "
        "0 differed, 0 missing\r[listen] speculative: 1116 windows played, 0 streams open, "
        "3 later copies dropped, 1 differed, 2 missing\nrequest s7-0001 epoch 0: ...\n"
    )
    assert listener_progress(text) == {
        "played": 1116,
        "open_streams": 0,
        "later_copies": 3,
        "differed": 1,
        "missing": 2,
    }
    assert listener_progress("no progress yet") == {}


def test_the_slope_is_fitted_over_every_pair_of_samples_not_two_points() -> None:
    times = [0.0, 1.0, 2.0, 3.0, 4.0]
    assert slope(times, [1.0, 3.0, 5.0, 7.0, 9.0]) == pytest.approx(2.0)
    # one spike at the end moves two points' slope a lot, the fitted one not at all
    spiked = [100.0, 100.0, 100.0, 100.0, 100.0, 100.0, 100.0, 100.0, 100.0, 120.0]
    ten = [float(t) for t in range(10)]
    assert (spiked[-1] - spiked[0]) / (ten[-1] - ten[0]) > 2
    assert slope(ten, spiked) == 0.0
    assert slope([5.0, 5.0], [1.0, 2.0]) == 0.0


def test_a_dip_that_comes_back_is_no_growth_and_a_steady_leak_is() -> None:
    """Soak run 4: member a's fds dipped from 44 to 33 for six minutes after the rolling
    restart (its sockets to the restarted nodes closed) and came back; a least-squares line
    over the half read that as +10 %, a DRIFT. A median of the pairwise slopes (Theil-Sen)
    is moved by neither a dip nor a spike that lasts under a quarter of the half, and still
    sees a leak of one fd every other minute."""
    minutes = [60.0 * m for m in range(31)]
    dipped = [44.0] * 8 + [33.0, 33.0] + [39.0] * 5 + [45.0] * 10 + [43.0] * 6
    assert growth_percent(minutes, dipped) == pytest.approx(0.0, abs=5.0)
    leaking = [40.0 + m // 2 for m in range(31)]
    assert growth_percent(minutes, leaking) == pytest.approx(15 / 40 * 100, rel=0.1)


@given(
    st.lists(st.integers(0, 200), min_size=4, max_size=30),
    st.integers(-5, 5),
    st.integers(0, 1000),
)
def test_a_line_plus_a_few_outliers_is_fitted_to_the_line(
    offsets: list[int], per_step: int, outlier: int
) -> None:
    """Fewer than a quarter of the samples off the line (a spike, a dip) leave the slope of
    the line: the median of the pairwise slopes."""
    times = [float(t) for t in range(len(offsets) * 4)]
    values = [100.0 + per_step * t for t in times]
    for k, at in enumerate(offsets[: len(times) // 5]):
        values[at % len(times)] += outlier * (-1) ** k
    assert slope(times, values) == pytest.approx(per_step)


def test_growth_is_the_fitted_rise_over_its_start() -> None:
    times = [0.0, 60.0, 120.0, 180.0]
    assert growth_percent(times, [100.0, 102.0, 104.0, 106.0]) == pytest.approx(6.0)
    assert growth_percent(times, [100.0, 100.0, 100.0, 100.0]) == pytest.approx(0.0)
    assert growth_percent(times, [100.0, 99.0, 98.0, 97.0]) == pytest.approx(-3.0)
    assert growth_percent(times[:2], [1.0, 2.0]) is None  # too few samples
    assert growth_percent(times, [0.0, 0.0, 0.0, 0.0]) is None


def sample(at_s: float, **rss_mb: float) -> Sample:
    return Sample(
        at_s,
        {
            role: ProcessSample(hash(role) % 1000 + 1, int(mb * 1e6), 30, 17)
            for role, mb in rss_mb.items()
        },
        {},
    )


def test_only_the_second_half_is_fitted() -> None:
    # grows fast during the first half (warming up), flat in the second
    samples = [sample(60.0 * m, member=600 + 30 * min(m, 5)) for m in range(11)]
    rss = [g for g in growths(samples, 600.0) if g.metric == "rss_bytes"]
    assert rss[0].percent == pytest.approx(0.0)
    leaking = [sample(60.0 * m, member=600 + 10 * m) for m in range(11)]
    found = next(g for g in growths(leaking, 600.0) if g.metric == "rss_bytes")
    assert found.percent is not None and found.percent > 5


def test_a_process_restarted_late_in_the_half_is_not_judged_and_says_why() -> None:
    samples = [sample(60.0 * m, node=700.0) for m in range(10)]
    late = ProcessSample(4242, int(300e6), 30, 17)
    samples += [Sample(600.0, {"node": late}, {})]  # another pid at the last sample
    found = next(g for g in growths(samples, 600.0) if g.metric == "rss_bytes")
    assert found.percent is None and found.note.startswith("restarted at 10.0 min")
    word, _ = verdict(Correctness(), growths(samples, 600.0), [1.0, 1.0, 1.0, 1.0])
    assert word == OK


def test_a_process_restarted_in_the_half_is_fitted_after_its_own_warm_up() -> None:
    """Member a after the `member` fault: a new process at 12 min of 20, growing to its working
    size for four minutes, then flat: no drift. Fitted from 17 min (five after the restart)."""

    def member(minute: int) -> ProcessSample:
        if minute < 12:
            return ProcessSample(100, int(900e6), 30, 17)
        return ProcessSample(200, int((600 + 80 * min(minute - 12, 4)) * 1e6), 30, 17)

    rows = [Sample(60.0 * m, {"member-a": member(m)}, {}) for m in range(21)]
    found = next(g for g in growths(rows, 1200.0) if g.metric == "rss_bytes")
    assert found.percent == pytest.approx(0.0) and found.samples == 4
    assert found.note == "restarted at 12.0 min"
    assert verdict(Correctness(), growths(rows, 1200.0), [])[0] == OK


# soak run 6 (seed 29): node 3's open fds, minute by minute, from the rolling restart at 28 min
# to the end of the hour; before it, another process at about 180
RUN_6_NODE_3_FDS = [154, 150, 150, 152, 152, 173, 169, 174, 176, 176, 188, 184, 184, 186, 186, 187]
RUN_6_NODE_3_FDS += [186, 189, 191, 188, 184, 190, 190, 194, 192, 195, 192, 188, 189, 190, 188]
RUN_6_NODE_3_FDS += [185, 185]


def node_rows(after_restart: list[float]) -> list[Sample]:
    """A node at 180 fds for 28 minutes, restarted, then `after_restart` minute by minute."""

    def fds(minute: int) -> ProcessSample:
        if minute < 28:
            return ProcessSample(100, int(700e6), 180, 105)
        return ProcessSample(200, int(700e6), int(after_restart[minute - 28]), 105)

    return [Sample(60.0 * m, {"node-3": fds(m)}, {}) for m in range(28 + len(after_restart))]


def test_a_restarted_node_is_fitted_once_its_connections_are_back() -> None:
    """Run 6: a node's fds came back in steps for 10 minutes after its restart (its clients
    reconnecting as its leaderships returned), then held where they stood before; fitted
    from 5 minutes after the restart that read +8.2 %, a DRIFT. A node is fitted from 10
    minutes after its restart; a member still from 5; a node that leaks after its warm-up
    is still a drift."""
    assert restart_warmup_s("node-3") == 600.0 and restart_warmup_s("member-a") == 300.0
    rows = node_rows([float(v) for v in RUN_6_NODE_3_FDS])
    fds = next(g for g in growths(rows, 3600.0) if g.metric == "fds")
    assert fds.percent is not None and fds.percent < 5 and fds.samples == 23
    assert verdict(Correctness(), growths(rows, 3600.0), [1.0, 1.0, 1.0, 1.0])[0] == OK
    leaking = node_rows([150.0 + m for m in range(33)])
    fds = next(g for g in growths(leaking, 3600.0) if g.metric == "fds")
    assert fds.percent is not None and fds.percent > 5 and fds.drifts


def test_a_working_set_that_fills_by_design_is_fitted_once_full() -> None:
    """A listener remembers ten minutes of ended streams: it grows for ten minutes, then no
    more. In a 10-minute run it is not judged (and says why); in 20 minutes, from minute 10."""
    rows = [sample(60.0 * m, **{"listener-committed": 55 + min(m, 10)}) for m in range(21)]

    def ten_minutes(role: str) -> float:
        return 600.0

    short = next(
        g for g in growths(rows[:11], 600.0, filling=ten_minutes) if g.metric == "rss_bytes"
    )
    assert short.percent is None and short.note.startswith("fills its working set for 10 min")
    full = next(g for g in growths(rows, 1200.0, filling=ten_minutes) if g.metric == "rss_bytes")
    assert full.percent == pytest.approx(0.0)
    grown = next(g for g in growths(rows[:11], 600.0) if g.metric == "rss_bytes")
    assert grown.percent is not None and grown.percent > 5  # judged from 5 min: a drift


def test_a_small_absolute_rise_of_threads_or_fds_is_no_drift() -> None:
    rows = [
        Sample(60.0 * m, {"talker": ProcessSample(5, int(40e6), 14, 7 + (m >= 8))}, {})
        for m in range(11)
    ]
    found = growths(rows, 600.0)
    threads = next(g for g in found if g.metric == "threads")
    assert threads.percent is not None and threads.percent > 5  # one thread of seven
    assert verdict(Correctness(), found, [])[0] == OK


def test_tooling_is_sampled_but_not_judged() -> None:
    rows = [sample(60.0 * m, toxiproxy=20 + 2 * m) for m in range(11)]
    found = growths(rows, 600.0, judged=lambda role: role != "toxiproxy")
    assert next(g for g in found if g.metric == "rss_bytes").percent is not None
    assert verdict(Correctness(), found, [])[0] == OK


def test_lag_quarters_leave_the_faults_and_their_settling_out() -> None:
    points = [LagPoint(float(t), None, 0.2, None) for t in range(0, 400, 5)]
    points += [LagPoint(350.0, None, 30.0, None)]  # during a fault in the last quarter
    quarters = quarter_p99(points, 400.0, faults=[(340.0, 345.0)])
    assert quarters == pytest.approx([0.2, 0.2, 0.2, 0.2])
    assert math.isnan(quarter_p99([], 400.0)[0])


def test_lag_creeps_beyond_the_tolerance_only() -> None:
    assert not lag_creeps(1.0, 1.4)
    assert lag_creeps(1.0, 1.6)
    assert lag_creeps(4.0, 5.1) and not lag_creeps(4.0, 4.9)  # a quarter of it
    assert not lag_creeps(math.nan, 10.0)


def test_the_verdict_fails_on_anything_lost_or_wrong_before_it_looks_at_growth() -> None:
    leak = [Growth("member-a", "rss_bytes", 12.0, 30)]
    assert verdict(Correctness(), leak, [])[0] == DRIFT
    assert verdict(Correctness(lost=1), leak, [])[0] == FAIL
    assert verdict(Correctness(duplicated=2), [], [])[0] == FAIL
    assert verdict(Correctness(anomalies={"aborted_read": 1}), [], [])[0] == FAIL
    assert verdict(Correctness(anomalies={"aborted_read": 0}), [], [])[0] == OK
    word, reasons = verdict(Correctness(failures=["member a exited 1 at 3.0 min"]), [], [])
    assert (word, reasons) == (FAIL, ["member a exited 1 at 3.0 min"])
    assert verdict(Correctness(), [], [0.5, 0.5, 0.5, 2.0]) == (
        DRIFT,
        ["lag p99 2.00 s in the last quarter, 0.50 s in the second"],
    )


def test_the_last_line_has_the_issues_shape() -> None:
    rows = [sample(60.0 * m, **{"member-a": 600 + m, "talker": 40.0}) for m in range(11)]
    found = growths(rows, 600.0)
    line = verdict_line(10, 2, Correctness(), found, rows, 0.84, OK)
    assert line.startswith("soak 10 min, 2 faults: 0 lost, 0 duplicated; RSS growth ")
    assert "(worst: member-a), fds 60 -> 60, lag p99 0.84 s; verdict OK" in line


def test_the_tables_have_a_row_per_process_and_per_sample() -> None:
    rows = [sample(60.0 * m, **{"member-a": 600.0, "node-1": 700.0}) for m in range(5)]
    rows[2].processes["node-1"] = None  # down at that moment
    table = process_table(rows, growths(rows, 300.0))
    assert table.count("\n") == 3 and "| node-1 | 700 / - / 700 |" in table
    timeline = time_table(rows, ["a", "b"])
    assert timeline.count("\n") == 1 + len(rows)


def test_the_fault_plan_is_seeded_spread_and_ends_in_time() -> None:
    faults = ["leader", "pause", "down", "resets"]
    plan = fault_plan(3600.0, 240.0, faults, random.Random(7))
    assert plan == fault_plan(3600.0, 240.0, faults, random.Random(7))
    assert plan != fault_plan(3600.0, 240.0, faults, random.Random(8))
    assert all(p.at_s + FAULT_ROOM_S + 360.0 <= 3600.0 for p in plan)  # and a 6-minute cool-down
    assert all(b.at_s - a.at_s >= 120.0 for a, b in itertools.pairwise(plan))
    assert sorted(p.fault for p in plan[:4]) == sorted(faults)  # each once before a repeat
    every = ["f" + str(i) for i in range(14)]  # an hour at the default: each of 14 once
    assert all({p.fault for p in fault_plan(3600.0, 210.0, every, random.Random(s))} == set(every)
               for s in range(20))  # fmt: skip
    assert len(fault_plan(600.0, 240.0, faults, random.Random(7))) == 2
    assert fault_plan(600.0, 0.0, faults, random.Random(7)) == []
