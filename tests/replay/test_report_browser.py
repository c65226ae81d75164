"""`codeclog report` pages opened in a real headless Chromium (Debian's `chromium`, installed by
scripts/bootstrap.sh): they load with no console error and no request beyond the file itself,
show every request id and the upstream error, draw one timeline mark per input record, show a
record's metadata on hover, play their audio, and are not blank.

Without a browser the tests are skipped with the reason, except in CI (env CI set), where a
missing browser is a failure: bootstrap installs it there.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from codeclog.consumers.stream.fold.state import Policy
from codeclog.devtools.browser import Browser, Page, find_browser
from codeclog.replay.inputs import load_input
from codeclog.replay.report import model
from codeclog.replay.report.model import InputRun, ReportOptions, build_page, run_input
from codeclog.replay.report.render import render_page
from codeclog.replay.report.timeline import MARK_KINDS
from codeclog.replay.report.writer import write_report
from codeclog.replay.runner import ReplayResult

SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "data" / "scenarios").glob("*.jsonl"))
READY = "document.body.dataset.ready === '1'"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = find_browser()
    if executable is None:
        reason = "no Chromium: scripts/bootstrap.sh installs Debian's chromium when run as root"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must have it")
        pytest.skip(reason)
    opened = Browser(executable)
    yield opened
    opened.close()


def _open(browser: Browser, path: Path) -> Page:
    page = browser.open_page(path, READY)
    assert page.load.console_errors == []
    assert page.load.requests[0] == path.resolve().as_uri()
    assert all(url.startswith("data:") for url in page.load.requests[1:]), page.load.requests
    return page


def _timelines(page: Page) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = page.evaluate(
        "Array.from(document.querySelectorAll('.timeline')).map(e => ({...e.dataset}))"
    )
    return found


def _painted_colours(page: Page, selector: str) -> int:
    """Distinct colours on a canvas (a blank one has one, or none)."""
    count: int = page.evaluate(
        f"""(() => {{
        const c = document.querySelector({json.dumps(selector)});
        const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        const seen = new Set();
        for (let i = 0; i < px.length; i += 4) seen.add(px[i] << 16 | px[i + 1] << 8 | px[i + 2]);
        return seen.size; }})()"""
    )
    return count


def _assert_not_blank(png: bytes) -> None:
    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot is (nearly) blank"
    assert max(count for count, _ in colours) < 0.95 * image.width * image.height


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_each_scenario_report_opens_and_shows_the_incident(
    browser: Browser, scenario: Path, tmp_path: Path
) -> None:
    out = tmp_path / f"{scenario.stem}.html"
    write_report([scenario], out, ReportOptions())
    expected = json.loads(scenario.with_suffix("").with_suffix(".expected.json").read_text())
    page = _open(browser, out)
    text = page.evaluate("document.body.innerText")
    for request_id in expected["tolerant"]["requests"]:
        assert request_id in text
    fatal = expected["strict"]["stage"]["fatal"]
    if fatal is not None:  # an incident: the upstream's reason, its error text, the victims
        assert fatal["reason"] in text
        assert "MiniCPMO45Code2WavBatchError {" in text
    records = len(load_input(scenario).events)
    [timeline] = _timelines(page)
    assert timeline["records"] == timeline["marks"] == timeline["drawn"] == str(records)
    assert _painted_colours(page, ".timeline canvas") > 10
    _assert_not_blank(page.screenshot())
    page.close()


def test_hovering_a_mark_shows_its_record(browser: Browser, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    write_report([SCENARIOS[1]], out, ReportOptions())
    page = _open(browser, out)
    # the fatal record (#3 of scenario 02) is the tolerant run's only "gap" mark
    series = MARK_KINDS.index("gap")  # one scatter series per kind, in this order
    tip = f"{{type: 'showTip', seriesIndex: {series}, dataIndex: 0}}"
    page.evaluate(f"codeclogCharts[0].dispatchAction({tip})")
    tip = page.evaluate(
        """new Promise(done => setTimeout(() => done(Array.from(
        document.querySelectorAll('.timeline div')).map(d => d.innerText)
        .find(t => t.includes('record #')) || ''), 100))"""
    )
    for shown in ("record #3", "request r1", "epoch 1", "chunk_seq 1", "frames 28", "gap"):
        assert shown in tip, tip
    page.close()


def test_two_inputs_ring_their_first_divergence(browser: Browser, tmp_path: Path) -> None:
    out = tmp_path / "two.html"
    write_report(SCENARIOS[:2], out, ReportOptions())
    page = _open(browser, out)
    assert [t["marks"] for t in _timelines(page)] == ["3", "5"]
    rings = page.evaluate(
        "codeclogCharts.map(c => c.getModel().getSeriesByIndex(c.getOption().series"
        ".findIndex(s => s.id === 'divergences')).getData().count())"
    )
    assert rings == [1, 1]
    assert "final False vs True" in page.evaluate("document.body.innerText")
    page.close()


def _with_audio(run: InputRun, pcm: dict[Policy, dict[str, bytes]]) -> InputRun:
    results = {p: ReplayResult(r.report, pcm.get(p, {})) for p, r in run.results.items()}
    return InputRun(run.label, run.source, results, run.timelines)


def test_audio_plays_inline_with_its_waveform(browser: Browser, tmp_path: Path) -> None:
    # The audio of a real vocoder is the long test below; here, PCM made up for the page
    options = ReportOptions(vocoder="tiny")
    run = run_input("A", load_input(SCENARIOS[1]), ReportOptions())
    tone = bytes(range(256)) * 240  # 1.28 s of a sawtooth-like 16-bit signal
    run = _with_audio(run, {Policy.TOLERANT: {"r1": tone}, Policy.STRICT: {"r1": tone[:9600]}})
    out = tmp_path / "audio.html"
    out.write_text(render_page(build_page([run], options, "test")))
    page = _open(browser, out)
    durations = page.evaluate(
        """Promise.all(Array.from(document.querySelectorAll('audio')).map(a =>
        a.readyState >= 1 ? a.duration : new Promise(done =>
        a.addEventListener('loadedmetadata', () => done(a.duration)))))"""
    )
    assert durations == [pytest.approx(1.28, abs=0.01), pytest.approx(0.2, abs=0.01)]
    assert _painted_colours(page, "canvas.wave") > 2
    page.close()


@pytest.mark.long  # CI: test_audio_plays_inline_with_its_waveform (made-up PCM, no torch)
@pytest.mark.vocoder
@pytest.mark.slow
def test_a_vocoded_report_plays_each_policys_audio(browser: Browser, tmp_path: Path) -> None:
    out = tmp_path / "vocoded.html"
    write_report([SCENARIOS[1]], out, ReportOptions(vocoder="tiny"))
    page = _open(browser, out)
    labels = page.evaluate("Array.from(document.querySelectorAll('.clip-label'), e => e.innerText)")
    assert [label.split(":")[0] for label in labels] == [
        "tolerant",
        "strict (up to the fatal point)",
    ]
    assert page.evaluate("document.querySelectorAll('audio').length") == 2
    page.close()


def test_a_long_request_id_does_not_widen_the_page(browser: Browser, tmp_path: Path) -> None:
    """A 3,000-character request id made the page 23,864 px wide; it is cut short, whole in
    its tooltip (`title`)."""
    rid = "r" * 3_000
    scenario = tmp_path / "long.jsonl"
    lines = [{"request_id": rid, "codes": [1]}, {"request_id": rid, "codes": [1, 2, 3, 4, 5]}]
    scenario.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "long.html"
    write_report([scenario], out, ReportOptions(Policy.STRICT))
    page = _open(browser, out)
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    titles = page.evaluate("Array.from(document.querySelectorAll('.rid'), e => e.title)")
    assert titles and set(titles) == {rid}
    page.close()


def test_a_timeline_drawn_in_layers_still_shows_a_record_on_hover(
    browser: Browser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above LARGE_TIMELINE_MARKS records (a 146,000-record capture: bench/bench_report.py)
    the marks are drawn as one layer per kind; a real mouse over a mark shows its record."""
    monkeypatch.setattr(model, "LARGE_TIMELINE_MARKS", 0)
    out = tmp_path / "large.html"
    write_report([SCENARIOS[1]], out, ReportOptions())
    page = _open(browser, out)
    [timeline] = _timelines(page)
    assert timeline["mode"] == "large" and timeline["drawn"] == timeline["records"] == "5"
    x, y = page.evaluate(
        """(() => { const box = document.getElementById('timeline-0').getBoundingClientRect();
        const at = codeclogCharts[0].convertToPixel({seriesIndex: 0}, [3, 0]);
        return [box.left + at[0], box.top + at[1]]; })()"""
    )
    page.move_mouse(x, y)
    tip = page.evaluate(
        """new Promise(done => setTimeout(() => done(Array.from(
        document.querySelectorAll('.timeline div')).map(d => d.innerText)
        .find(t => t.includes('record #')) || ''), 200))"""
    )
    assert "record #3" in tip and "request r1" in tip, tip
    page.close()
