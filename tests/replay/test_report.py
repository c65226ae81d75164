"""`codeclog report`'s data and page, without a browser: the per-record timeline tells what the
replay report tells, the fatal section is replay's, divergences land on their records, audio is
playable WAV, the page has no external reference, and its size stays bounded."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import random
import re
import wave
from pathlib import Path
from typing import Any

import pytest

from codeclog.consumers.stream.fold.state import Policy
from codeclog.replay.inputs import ReplayInput, load_input
from codeclog.replay.report import model
from codeclog.replay.report.audio import clip_of, peaks
from codeclog.replay.report.model import ReportOptions, build_page, run_input
from codeclog.replay.report.render import render_page
from codeclog.replay.report.timeline import CLEAN_KINDS, NO_ID, Timeline, build_timeline
from codeclog.replay.report.writer import write_report
from codeclog.replay.runner import ReplayOptions, replay
from codeclog.replay.summary import format_summary
from codeclog.replay.synthetic import metadata_for, write_capture
from codeclog.schemas.records import CodecChunk
from codeclog.schemas.wire import decode, encode
from codeclog.testing.upstream_streams import realistic_events
from tests.replay.captures import write_events

SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "data" / "scenarios").glob("*.jsonl"))
FIVE_MB = 5_000_000


def _outcomes_by_request(timeline: Timeline) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for mark in timeline.marks:
        for outcome in mark.outcomes:
            entry = dict(outcome)
            found.setdefault(entry.pop("request_id"), []).append(entry)
    return found


def _report_outcomes(source: ReplayInput, policy: Policy) -> dict[str, list[dict[str, Any]]]:
    report = replay(source, ReplayOptions(policy, workers=1)).report
    return {rid: e["outcomes"] for rid, e in report["requests"].items() if e["outcomes"]}


@pytest.mark.parametrize("policy", list(Policy), ids=lambda p: p.value)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_the_timeline_holds_every_record_and_exactly_the_reports_outcomes(
    scenario: Path, policy: Policy
) -> None:
    source = load_input(scenario)
    timeline = build_timeline(source, policy)
    assert [mark.index for mark in timeline.marks] == list(range(len(source.events)))
    assert _outcomes_by_request(timeline) == _report_outcomes(source, policy)


def _capture(tmp_path: Path, name: str, seed: int = 7, sessions: int = 12) -> Path:
    events = realistic_events(random.Random(seed), sessions=sessions, turns=2)
    write_events(tmp_path / name, events, 4, txn_records=5, block_records=50)
    return tmp_path / name


def test_a_capture_with_undecodable_records_has_a_mark_for_each_record(tmp_path: Path) -> None:
    events = realistic_events(random.Random(1), sessions=3, turns=1)
    path = tmp_path / "bad.ocf"
    records = write_events(path, events, 2, damaged={1: b"not avro at all", 4: None})
    source = load_input(path)
    timeline = build_timeline(source, Policy.TOLERANT)
    assert len(timeline.marks) == len(records)
    refused = [m for m in timeline.marks if m.cache_epoch is None]
    assert len(refused) == 2 and {m.kind for m in refused} == {"rejected"}
    assert {i.reason for m in refused for i in m.issues} == {"undecodable_record"}
    assert {m.request_id for m in refused} <= {e.request_id for e in events}
    assert _outcomes_by_request(timeline) == _report_outcomes(source, Policy.TOLERANT)


def test_strict_marks_the_fatal_record_and_everything_after_it_unprocessed() -> None:
    source = load_input(SCENARIOS[1])  # 02: the admitting chunk lost
    timeline = build_timeline(source, Policy.STRICT)
    assert timeline.fatal is not None and timeline.fatal_index == 3
    assert [m.kind for m in timeline.marks] == ["decoded"] * 3 + ["rejected", "unprocessed"]
    assert timeline.marks[3].chunk_seq == 1 and timeline.marks[3].cache_epoch == 1


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_the_fatal_section_prints_what_replay_prints(scenario: Path) -> None:
    source = load_input(scenario)
    page = build_page([run_input("A", source, ReportOptions())], ReportOptions(), "test")
    fatal = page["inputs"][0]["fatal"]
    strict = replay(source, ReplayOptions(Policy.STRICT)).report
    if strict["stage"]["fatal"] is None:
        assert fatal is None
        return
    printed = format_summary(strict)
    assert fatal["error"] in printed  # the exact upstream error text and JSON
    assert f"requests it would have killed: {', '.join(fatal['killed'])}" in printed
    assert fatal["reason"] == strict["stage"]["fatal"]["reason"]


def test_two_captures_show_the_first_divergence_on_its_records(tmp_path: Path) -> None:
    path_a = _capture(tmp_path, "a.ocf")
    source_a = load_input(path_a)
    records = list(source_a.records)
    changed = next(i for i, r in enumerate(records) if i > 20 and r.partition == 2)
    chunk = decode(records[changed].value)
    assert isinstance(chunk, CodecChunk)
    other = encode(dataclasses.replace(chunk, codes=(7, *chunk.codes[1:])))
    records[changed] = dataclasses.replace(records[changed], value=other)
    path_b = tmp_path / "b.ocf"
    write_capture(path_b, records, source_a.metadata or metadata_for(records, partitions=4))
    options = ReportOptions()
    runs = [run_input(label, load_input(p), options) for label, p in (("A", path_a), ("B", path_b))]
    page = build_page(runs, options, "test")
    key = records[changed].key
    assert key is not None
    [divergence] = page["divergences"]
    assert divergence["request"] == key.decode() and divergence["marks"] == [changed, changed]
    assert "codes" in divergence["what"]
    for view in page["inputs"]:
        [mark] = view["divergence_marks"]
        assert mark["index"] == changed and view["rows"][mark["row"]] == key.decode()


def test_two_scenarios_are_compared_by_their_reports() -> None:
    options = ReportOptions()
    runs = [
        run_input(label, load_input(SCENARIOS[i]), options) for label, i in (("A", 0), ("B", 1))
    ]
    page = build_page(runs, options, "test")
    stage, request = page["divergences"]  # 01: a clean turn; 02: a shorter turn, then more
    assert stage == {"request": None, "what": "stage: events 3 vs 5", "marks": [None, None]}
    assert request["request"] == "r1" and "final False vs True" in request["what"]
    assert request["marks"] == [1, 1]  # outcome 1 of r1: the decode of record #1 on each side
    assert [view["divergence_marks"] for view in page["inputs"]] == [
        [{"index": 1, "row": 0, "what": request["what"]}]
    ] * 2


def test_audio_is_a_playable_wav_with_its_peaks() -> None:
    pcm = b"".join(int(v).to_bytes(2, "little", signed=True) for v in (0, 16384, -32768, 100))
    clip = clip_of(pcm * 600)
    with wave.open(io.BytesIO(base64.b64decode(clip.wav_base64))) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24000, 1, 2)
        assert wav.readframes(wav.getnframes()) == pcm * 600
    assert clip.seconds == 0.1
    assert len(clip.peaks) == 800 and min(p[0] for p in clip.peaks) == -1.0
    assert peaks(b"") == [] and peaks(pcm, buckets=2) == [(0.0, 0.5), (-1.0, 0.003)]


def test_the_page_references_nothing_outside_itself(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    write_report([SCENARIOS[2]], out, ReportOptions())
    html = out.read_text()
    markup = re.sub(r"(<script[^>]*>).*?</script>", r"\1", html, flags=re.S)  # the HTML alone
    assert not re.search(r"\s(src|href)=\"(?!data:|#)", markup), "only inline data and anchors"
    assert "<link" not in markup and "@import" not in markup
    assert markup.count("<script") == 3  # the data, ECharts, the report's script: all inline
    assert json.loads(_script_data(html))["inputs"][0]["rows"] == ["a", "b"]


def _script_data(html: str) -> str:
    opening = '<script id="report-data" type="application/json">'
    match = re.search(re.escape(opening) + "(.*?)</script>", html, re.S)
    assert match is not None
    json.loads(match.group(1))
    return match.group(1)


def test_request_ids_are_escaped_in_the_page(tmp_path: Path) -> None:
    scenario = tmp_path / "evil.jsonl"
    rid = "</script><script>alert(1)</script>"
    scenario.write_text(json.dumps({"request_id": rid, "codes": [1, 2, 3, 4, 5]}) + "\n")
    out = tmp_path / "evil.html"
    write_report([scenario], out, ReportOptions())
    html = out.read_text()
    assert rid not in html and "&lt;/script&gt;" in html
    assert json.loads(_script_data(html))["inputs"][0]["rows"] == [rid]


def test_the_report_of_a_demo_sized_capture_stays_under_five_megabytes(tmp_path: Path) -> None:
    # 200 sessions of 2 turns: ~2,900 records, far more than the demo's 6 sessions write
    path = _capture(tmp_path, "big.ocf", sessions=200)
    written = write_report([path], tmp_path / "big.html", ReportOptions())
    assert written.records == len(load_input(path).records)
    assert written.size_bytes < FIVE_MB


def test_a_record_without_request_id_has_its_own_row(tmp_path: Path) -> None:
    scenario = tmp_path / "no_id.jsonl"
    lines = [{"request_id": "r1", "codes": [1, 2, 3, 4, 5]}, {"codes": [1, 2, 3, 4, 5]}]
    scenario.write_text("".join(json.dumps(line) + "\n" for line in lines))
    options = ReportOptions()
    view = build_page([run_input("A", load_input(scenario), options)], options, "t")["inputs"][0]
    assert view["rows"] == [NO_ID, "r1"] and view["marks"]["row"] == [1, 0]
    assert [(i["request"], i["reason"]) for i in view["issues"]] == [(NO_ID, "missing_request_id")]


# ----------------------------------------------------------------------------- issue 41


def _damaged_capture(tmp_path: Path, records: int, damaged: int) -> Path:
    """A capture of `records` records whose first `damaged` values no decoder reads: each is a
    non-clean record (a dead letter before the fold), cheap to replay."""
    events = realistic_events(random.Random(3), sessions=records // 15, turns=3)[:records]
    assert len(events) == records
    path = tmp_path / f"damaged-{damaged}.ocf"
    write_events(path, events, 4, damaged={i: b"not avro" for i in range(damaged)})
    return path


def test_a_page_of_thousands_of_non_clean_records_lists_some_counts_all_and_says_so(
    tmp_path: Path,
) -> None:
    """83,533 non-clean outcomes made an 83.6 MB page Chromium could not open: about 570 bytes
    each, mostly their table rows. The table now lists MAX_LISTED_ISSUES of them, counts all,
    and the page says so; what each non-clean record still adds (its mark) stays small."""
    sizes, non_clean = {}, {}
    for damaged in (1_500, 3_000):
        path = _damaged_capture(tmp_path, 3_100, damaged)
        options = ReportOptions()
        page = build_page([run_input("A", load_input(path), options)], options, "t")
        view = page["inputs"][0]
        total = view["issue_total"]
        assert len(view["issues"]) == model.MAX_LISTED_ISSUES < damaged <= total
        assert ["rejected", "undecodable_record", damaged] in view["issue_counts"]
        assert sum(count for *_, count in view["issue_counts"]) == total
        html = render_page(page)
        assert f"{total} non-clean outcomes: the first {model.MAX_LISTED_ISSUES}" in " ".join(
            html.split()
        )
        assert html.count("<tr data-kind=") == model.MAX_LISTED_ISSUES
        sizes[damaged] = len(html.encode())
        non_clean[damaged] = sum(n for k, n in view["kind_counts"].items() if k not in CLEAN_KINDS)
    per_record = (sizes[3_000] - sizes[1_500]) / (non_clean[3_000] - non_clean[1_500])
    assert per_record < 100, f"{per_record:.0f} bytes per non-clean record beyond the listed ones"


def test_a_large_timeline_is_drawn_in_layers_and_too_many_bands_are_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(model, "LARGE_TIMELINE_MARKS", 2)
    monkeypatch.setattr(model, "MAX_EPOCH_BANDS", 0)
    source = load_input(SCENARIOS[1])
    page = build_page([run_input("A", source, ReportOptions())], ReportOptions(), "t")
    view = page["inputs"][0]
    assert view["large"] and view["epochs"] == [] and view["epoch_total"] > 0
    text = " ".join(render_page(page).split())
    assert "drawn as one layer per kind" in text and "epoch bands are too many to shade" in text


def test_tooltips_word_an_outcomes_details_not_as_a_python_dict() -> None:
    """A rejection's hover text was `reject chunk_below_lookahead_window {'frames': 1, ...}`."""
    source = load_input(SCENARIOS[2])  # 03: strict rejects a chunk below the lookahead window
    options = ReportOptions(Policy.STRICT)
    page = build_page([run_input("A", source, options)], options, "t")
    whats = [w for w in page["inputs"][0]["marks"]["what"] if w.startswith("reject")]
    assert whats and not any("{'" in w or "': " in w for w in whats), whats
    assert any("(frames 1, minimum 4" in w for w in whats), whats


def test_a_long_request_id_is_cut_short_in_the_page_and_whole_in_its_title(
    tmp_path: Path,
) -> None:
    rid = "x" * 3_000
    scenario = tmp_path / "long.jsonl"
    scenario.write_text(json.dumps({"request_id": rid, "codes": [1]}) + "\n")
    out = tmp_path / "long.html"
    write_report([scenario], out, ReportOptions())
    html = out.read_text()
    assert f'<span class="rid" title="{rid}">{rid}</span>' in html
    assert 'class="rid"' in html and re.search(r"\.rid \{[^}]*text-overflow: ellipsis", html)
