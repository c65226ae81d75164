"""`codeclog report` at scale: the page of a capture with 100,000+ non-clean records, written and
opened in a real headless Chromium (issue 41: such a page was 83.6 MB and not ready after 60 s).

A synthetic capture of `--sessions` interleaved duplex sessions (codeclog.testing.upstream_streams,
about 10 chunks per turn) on `--partitions` partitions is written; with 5,500 sessions of 4 turns
on 8 partitions (about 162,000 records) the open-stream cap (1,024 over 8 partitions: 128 per
partition) evicts, and more than 100,000 records are non-clean (held, abandoned, rejected).
Then the report is built stage by stage as `codeclog report` builds it
(`replay.report.writer.write_report`: load, replay and timelines, the page's data, the HTML)
and opened in Chromium (codeclog.devtools.browser: Debian's `chromium`, headless, over the
DevTools pipe), timing:

- ready: from navigation until the page's script has drawn every timeline and wired the table
  (`document.body.dataset.ready`), plus two animation frames: the page answers input from here;
- sort: a click on the outcome table's `record #` header until the next frame is painted;
- filter: typing a request id into the outcome filter until the next frame;
- tooltip: moving the mouse onto a mark until its record shows in the tooltip.

    python -m bench.bench_report                       # 5,500 sessions, 4 turns: ~162,000 records
    python -m bench.bench_report --sessions 500        # a quick run
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_replay import cpu_calibration_s
from codeclog.devtools.browser import Browser, Page, find_browser
from codeclog.replay.report.model import ReportOptions, build_page, run_input
from codeclog.replay.report.render import render_page
from codeclog.replay.report.timeline import CLEAN_KINDS
from codeclog.replay.report.writer import load_report_input
from codeclog.replay.synthetic import metadata_for, records_from_events, write_capture
from codeclog.testing.upstream_streams import realistic_events
from codeclog.version import __version__

READY = "document.body.dataset.ready === '1'"
TARGET_READY_S = 10.0
NEXT_FRAME = "new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"
# hover the first mark on a row in view: its kind's series, its place among that kind's marks
FIND_MARK = """(() => {
const m = JSON.parse(document.getElementById('report-data').textContent).inputs[0].marks;
let i = 0; while (m.row[i] >= 30) i++;
const chart = document.getElementById('timeline-0'); chart.scrollIntoView();
const box = chart.getBoundingClientRect();
const at = codeclogCharts[0].convertToPixel({seriesIndex: m.kind[i]}, [i, m.row[i]]);
return [box.left + at[0], box.top + at[1]]; })()"""
TIP_SHOWN = """Array.from(document.querySelectorAll('.timeline div'))
  .some(d => d.innerText.includes('record #'))"""


def make_capture(path: Path, sessions: int, turns: int, partitions: int, seed: int) -> int:
    events = realistic_events(random.Random(seed), sessions=sessions, turns=turns)
    records = records_from_events(events, partitions=partitions)
    write_capture(path, records, metadata_for(records, partitions=partitions))
    return len(records)


def write_page(capture: Path, out: Path) -> dict[str, Any]:
    """The report of `capture` into `out`, stage by stage, with its figures."""
    options = ReportOptions()
    started = time.perf_counter()
    source = load_report_input(capture)
    loaded = time.perf_counter()
    run = run_input("A", source, options)
    replayed = time.perf_counter()
    page = build_page([run], options, __version__)
    built = time.perf_counter()
    data = render_page(page).encode("utf-8")
    out.write_bytes(data)
    written = time.perf_counter()
    view = page["inputs"][0]
    kinds = view["kind_counts"]
    return {
        "records": len(view["marks"]["row"]),
        "requests": len(view["rows"]),
        "non_clean": sum(count for kind, count in kinds.items() if kind not in CLEAN_KINDS),
        "issues": view["issue_total"],
        "listed": len(view["issues"]),
        "large": view["large"],
        "bytes": len(data),
        "load_s": loaded - started,
        "replay_s": replayed - loaded,
        "data_s": built - replayed,
        "html_s": written - built,
        "write_s": written - started,
    }


def _timed(page: Page, action: str) -> float:
    """Milliseconds from running `action` (JavaScript) until the next frame is painted."""
    elapsed: float = page.evaluate(
        f"(async () => {{ const t = performance.now(); {action}; await {NEXT_FRAME}; "
        "return performance.now() - t; })()"
    )
    return elapsed


def _hover(page: Page, x: float, y: float) -> tuple[float, bool]:
    """Milliseconds from moving the mouse onto (x, y) until a record's tooltip shows (at most
    2 s), and whether it did."""
    started = time.perf_counter()
    page.move_mouse(x, y)
    while not (shown := bool(page.evaluate(TIP_SHOWN))) and time.perf_counter() - started < 2:
        time.sleep(0.01)
    return (time.perf_counter() - started) * 1000, shown


def open_page(executable: str, path: Path, timeout_s: float) -> dict[str, Any]:
    browser = Browser(executable)
    try:
        started = time.perf_counter()
        page = browser.open_page(path, READY, timeout_s)
        ready_s = time.perf_counter() - started
        sort_ms = _timed(page, "document.querySelector('#outcome-table th').click()")
        rid = page.evaluate(
            "JSON.parse(document.getElementById('report-data').textContent)"
            ".inputs[0].rows.slice(-1)[0]"
        )
        filter_ms = _timed(
            page,
            f"const f = document.getElementById('outcome-filter'); f.value = {rid!r}; "
            "f.dispatchEvent(new Event('input'))",
        )
        tooltip_ms, shown = _hover(page, *page.evaluate(FIND_MARK))
        timeline = page.evaluate("({...document.querySelector('.timeline').dataset})")
        errors = page.collect().console_errors
        page.close()
    finally:
        browser.close()
    return {
        "ready_s": ready_s,
        "sort_ms": sort_ms,
        "filter_ms": filter_ms,
        "tooltip_ms": tooltip_ms,
        "tooltip_shown": shown,
        "drawn": timeline.get("drawn"),
        "mode": timeline.get("mode"),
        "console_errors": errors,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=5500)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="for the page to be ready")
    args = parser.parse_args(argv)
    executable = find_browser()
    if executable is None:
        print("no Chromium: scripts/bootstrap.sh installs Debian's chromium", file=sys.stderr)
        return 2
    calibration = cpu_calibration_s()
    with tempfile.TemporaryDirectory() as tmp:
        capture, out = Path(tmp) / "bench.ocf", Path(tmp) / "bench.html"
        make_capture(capture, args.sessions, args.turns, args.partitions, args.seed)
        written = write_page(capture, out)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        shown = open_page(executable, out, args.timeout_s)
    command = "python -m bench.bench_report " + " ".join(argv if argv is not None else sys.argv[1:])
    print_results(written, shown, peak_mb, calibration, command.strip())
    return 0 if shown["ready_s"] <= TARGET_READY_S and not shown["console_errors"] else 1


def print_results(
    w: dict[str, Any], b: dict[str, Any], peak_mb: float, calibration: float, command: str
) -> None:
    print(
        f"capture: {w['records']:,} records, {w['requests']:,} requests, {w['non_clean']:,} "
        f"non-clean records ({w['issues']:,} non-clean outcomes, {w['listed']:,} listed)"
    )
    print(f"cpu calibration: sum(range(10**7)) took {calibration:.3f} s (idle: ~0.15 s)")
    print(
        f"write: {w['write_s']:.1f} s (load {w['load_s']:.1f}, replay + timelines "
        f"{w['replay_s']:.1f}, page data {w['data_s']:.1f}, HTML {w['html_s']:.1f}); "
        f"peak RSS {peak_mb:,.0f} MB; page {w['bytes'] / 1e6:.1f} MB "
        f"({w['bytes'] / max(w['records'], 1):.0f} bytes per record)"
    )
    print(
        f"chromium: ready in {b['ready_s']:.2f} s (timeline mode {b['mode']}, {b['drawn']} marks "
        f"drawn); sort {b['sort_ms']:.0f} ms, filter {b['filter_ms']:.0f} ms, tooltip "
        f"{b['tooltip_ms']:.0f} ms (shown: {b['tooltip_shown']}); console errors: "
        f"{len(b['console_errors'])}"
    )
    verdict = "meets" if b["ready_s"] <= TARGET_READY_S else "MISSES"
    print(f"target: interactive within {TARGET_READY_S:.0f} s: {verdict}")
    print()
    print(
        "| records | non-clean | page | bytes/record | write | ready in Chromium | sort | filter "
        "| tooltip | calibration | command |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {w['records']:,} | {w['non_clean']:,} | {w['bytes'] / 1e6:.1f} MB "
        f"| {w['bytes'] / max(w['records'], 1):.0f} | {w['write_s']:.0f} s "
        f"| {b['ready_s']:.2f} s | {b['sort_ms']:.0f} ms | {b['filter_ms']:.0f} ms "
        f"| {b['tooltip_ms']:.0f} ms | {calibration:.3f} s | `{command}` |"
    )


if __name__ == "__main__":
    sys.exit(main())
