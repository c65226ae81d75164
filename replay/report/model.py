"""What the incident report shows, as plain data: one view per input, and their divergences.
Its sources and limits: docs/report.md, "What each section shows" and "Size"."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from codeclog.consumers.stream.fold.state import Policy
from codeclog.replay.diff import NO_KEY, Divergence, diff_captures, diff_reports
from codeclog.replay.inputs import InputKind, ReplayInput
from codeclog.replay.report.audio import Clip, clip_of
from codeclog.replay.report.timeline import (
    MARK_KINDS,
    NO_ID,
    Mark,
    Timeline,
    build_timeline,
)
from codeclog.replay.runner import VOCODER_NONE, ReplayOptions, ReplayResult, replay
from codeclog.replay.summary import COLUMNS, request_rows, upstream_error_text

KIND_COLORS: Mapping[str, str] = {
    "rejected": "#d32f2f",
    "gap": "#f57c00",
    "abandoned": "#6d4c41",
    "duplicate": "#8e24aa",
    "held": "#fbc02d",
    "decoded": "#43a047",
    "marker": "#1e88e5",
    "released": "#00897b",
    "unprocessed": "#bdbdbd",
    "no effect": "#546e7a",
}
assert tuple(KIND_COLORS) == MARK_KINDS

MAX_LISTED_ISSUES = 1_000  # rows of each input's non-clean outcomes in the outcome table
MAX_LISTED_REQUESTS = 5_000  # rows of each input's per-request table
LARGE_TIMELINE_MARKS = 20_000  # from here a timeline is drawn as one layer per kind
MAX_EPOCH_BANDS = 2_000  # (request, epoch) bands a timeline shades


@dataclasses.dataclass(frozen=True)
class ReportOptions:
    policy: Policy = Policy.TOLERANT  # the timeline's, the table's and the statuses' policy
    vocoder: str = VOCODER_NONE  # with a vocoder: audio under tolerant, and strict's if it differs
    kernels: str = "portable"
    skip_corrupt_blocks: bool = False  # read past a capture's corrupt blocks, and say so


@dataclasses.dataclass(frozen=True)
class InputRun:
    """One input replayed: the reports (and audio) per policy, the timelines per policy."""

    label: str  # "A", "B"
    source: ReplayInput
    results: Mapping[Policy, ReplayResult]
    timelines: Mapping[Policy, Timeline]


def run_input(label: str, source: ReplayInput, options: ReportOptions) -> InputRun:
    """Replay `source` under the report's policy and under strict (for the fatal section),
    and under both with the vocoder when there is one (the audio section)."""
    vocoding = options.vocoder != VOCODER_NONE
    policies = {options.policy, Policy.STRICT} | ({Policy.TOLERANT} if vocoding else set())
    results = {
        policy: replay(
            source,
            ReplayOptions(
                policy,
                options.vocoder,
                keep_pcm=vocoding,
                workers=1,
                kernels=options.kernels,
            ),
        )
        for policy in sorted(policies, key=lambda p: p.value)
    }
    timelines = {
        policy: build_timeline(source, policy) for policy in {options.policy, Policy.STRICT}
    }
    return InputRun(label, source, results, timelines)


def build_page(runs: Sequence[InputRun], options: ReportOptions, version: str) -> dict[str, Any]:
    """The whole page's data (JSON-able): the template renders it, the script draws it."""
    divergences = find_divergences(runs[0], runs[1], options.policy) if len(runs) == 2 else []
    # per input, the mark of each divergence there (None: stage level or absent there)
    at = [[divergence_mark(run, options.policy, d) for d in divergences] for run in runs]
    return {
        "title": " vs ".join(run.source.name for run in runs),
        "version": version,
        "policy": options.policy.value,
        "vocoder": options.vocoder,
        "kinds": [{"name": kind, "color": KIND_COLORS[kind]} for kind in MARK_KINDS],
        "colors": dict(KIND_COLORS),
        "columns": list(COLUMNS),
        "inputs": [
            _view(run, options, divergences, marks) for run, marks in zip(runs, at, strict=True)
        ],
        "divergences": [
            {"request": d.request_id, "what": d.describe(), "marks": [m[i] for m in at]}
            for i, d in enumerate(divergences)
        ],
    }


def _view(
    run: InputRun,
    options: ReportOptions,
    divergences: Sequence[Divergence],
    divergence_marks: Sequence[int | None],
) -> dict[str, Any]:
    report = run.results[options.policy].report
    timeline = run.timelines[options.policy]
    rows = sorted({mark.request_id for mark in timeline.marks})
    row_of = {rid: number for number, rid in enumerate(rows)}
    requests = request_rows(report)
    epochs = _epoch_bands(timeline.marks, row_of)
    issue_counts = Counter(
        (issue.kind, issue.reason) for mark in timeline.marks for issue in mark.issues
    )
    return {
        "label": run.label,
        "input": report["input"],
        "provenance": _provenance(report.get("provenance")),
        "requests": [list(row) for row in requests[:MAX_LISTED_REQUESTS]],
        "request_total": len(requests),
        "statuses": _counts(entry["status"] for entry in report["requests"].values()),
        "rejections": _counts(
            outcome["reason"]
            for entry in report["requests"].values()
            for outcome in entry["outcomes"]
            if outcome["kind"] == "reject"
        ),
        "dead_letters": report["dead_letters"],
        "events": report.get("events", 0),
        "unprocessed": report.get("unprocessed", 0),
        "fatal": _fatal(run),
        "rows": rows,
        "marks": _mark_columns(timeline.marks, row_of),
        "large": len(timeline.marks) > LARGE_TIMELINE_MARKS,
        "kind_counts": _counts(mark.kind for mark in timeline.marks),
        "epochs": epochs if len(epochs) <= MAX_EPOCH_BANDS else [],
        "epoch_total": len(epochs),
        "issues": list(itertools.islice(_issues(timeline.marks), MAX_LISTED_ISSUES)),
        "issue_total": sum(issue_counts.values()),
        "issue_counts": [
            [kind, reason, count]
            for (kind, reason), count in sorted(
                issue_counts.items(), key=lambda kv: (-kv[1], kv[0])
            )
        ],
        "divergence_marks": [
            {"index": index, "row": row_of[timeline.marks[index].request_id], "what": d.describe()}
            for d, index in zip(divergences, divergence_marks, strict=True)
            if index is not None
        ],
        "audio": _audio(run) if options.vocoder != VOCODER_NONE else [],
    }


def _counts(values: Any) -> dict[str, int]:
    return dict(sorted(Counter(values).items()))


def _provenance(provenance: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    if not provenance:
        return []
    offsets = ", ".join(
        f"p{partition} [{span[0]}, {span[1]})"
        for partition, span in sorted(provenance["offsets"].items(), key=lambda kv: int(kv[0]))
    )
    return [
        ("topic", str(provenance["topic"])),
        ("partitions", str(provenance["partition_count"])),
        ("offsets captured", offsets or "-"),
        ("cluster id", str(provenance["cluster_id"])),
        ("codeclog version", f"{provenance['codeclog_version']} ({provenance['git_commit']})"),
        ("isolation", str(provenance["isolation_level"])),
        ("request filter", ", ".join(provenance["request_filter"]) or "every key"),
    ]


def _fatal(run: InputRun) -> dict[str, Any] | None:
    """The strict policy's verdict: the upstream error, where, and whom it would have killed."""
    strict = run.results[Policy.STRICT].report
    timeline = run.timelines[Policy.STRICT]
    reject, index = timeline.fatal, timeline.fatal_index
    if reject is None or index is None:
        return None
    mark = timeline.marks[index]
    return {
        "reason": reject.reason.value,
        "request_id": reject.request_id or NO_ID,
        "cache_epoch": reject.cache_epoch,
        "chunk_seq": reject.chunk_seq,
        "error": upstream_error_text(reject.reason.value, reject.details_dict()),
        "killed": sorted(
            rid or NO_ID
            for rid, entry in strict["requests"].items()
            if entry.get("status") == "killed"
        ),
        "index": index,
        "position": _position(mark),
        "unprocessed": strict.get("unprocessed", 0),
    }


def _position(mark: Mark) -> str:
    if not mark.topic:
        return f"event #{mark.index} of the scenario"
    return f"record #{mark.index}: {mark.topic} partition {mark.partition} offset {mark.offset}"


def _mark_columns(marks: Sequence[Mark], row_of: Mapping[str, int]) -> dict[str, list[Any]]:
    """The marks as columns (a third of the size of one object per mark)."""
    kind_of = {kind: number for number, kind in enumerate(MARK_KINDS)}
    topics = sorted({mark.topic for mark in marks})
    topic_of = {topic: number for number, topic in enumerate(topics)}
    return {
        "topics": topics,
        "topic": [topic_of[mark.topic] for mark in marks],
        "row": [row_of[mark.request_id] for mark in marks],
        "kind": [kind_of[mark.kind] for mark in marks],
        "partition": [mark.partition for mark in marks],
        "offset": [mark.offset for mark in marks],
        "epoch": [mark.cache_epoch for mark in marks],
        "seq": [mark.chunk_seq for mark in marks],
        "frames": [mark.frames for mark in marks],
        "flags": [" ".join(mark.flags) for mark in marks],
        "what": [_what(mark) for mark in marks],
    }


def _what(mark: Mark) -> str:
    if mark.outcomes:
        return "; ".join(describe_outcome(o, mark.request_id) for o in mark.outcomes)
    return "; ".join(f"dead letter {issue.reason}" for issue in mark.issues)


def describe_outcome(outcome: Mapping[str, Any], own_request: str) -> str:
    """One outcome in a few words, for the timeline's tooltip."""
    kind = outcome["kind"]
    if kind == "decode":
        seqs = outcome["chunk_seqs"]
        span = f"{seqs[0]}-{seqs[-1]}" if len(seqs) > 1 else f"{seqs[0]}" if seqs else "-"
        text = f"decode window of seq {span}, {outcome['frames']} ids"
        text += ", final" if outcome["final"] else ""
    elif kind == "hold":
        text = f"hold ({outcome['frames']} ids held)"
    elif kind == "reject":
        details = outcome["details"]
        text = f"reject {outcome['reason']}" + (f" ({_readable(details)})" if details else "")
    elif kind == "gap":
        text = (
            f"gap: seq {outcome['missing_from']}-{outcome['missing_to']} missing "
            f"({outcome['discarded_frames']} held ids dropped)"
        )
    elif kind == "abandoned":
        text = f"abandoned epoch {outcome['cache_epoch']} ({outcome['frames']} ids held)"
    else:
        text = kind
    other = outcome.get("request_id", own_request)
    return text if other == own_request else f"{text} [request {other or NO_ID}]"


def _readable(details: Mapping[str, Any]) -> str:
    """`frames 1, minimum 4`: an outcome's details as words, values as JSON writes them."""
    return ", ".join(
        f"{key} {value if isinstance(value, str) else _json_text(value)}"
        for key, value in sorted(details.items())
    )


def _epoch_bands(marks: Sequence[Mark], row_of: Mapping[str, int]) -> list[list[int]]:
    """[row, epoch, first mark, last mark] for every (request, epoch) with a chunk."""
    spans: dict[tuple[str, int], list[int]] = {}
    for mark in marks:
        if mark.cache_epoch is not None:
            span = spans.setdefault((mark.request_id, mark.cache_epoch), [mark.index, mark.index])
            span[1] = mark.index
    return sorted([row_of[rid], epoch, *span] for (rid, epoch), span in spans.items())


def _issues(marks: Sequence[Mark]) -> Iterator[dict[str, Any]]:
    """The rows of the outcome table, in input order."""
    for mark in marks:
        for issue in mark.issues:
            yield {
                "index": mark.index,
                "request": issue.request_id,
                "partition": mark.partition,
                "offset": mark.offset,
                "topic": mark.topic,
                "epoch": issue.cache_epoch,
                "seq": issue.chunk_seq,
                "kind": issue.kind,
                "reason": issue.reason,
                "details": _json_text(issue.details) if issue.details else "",
            }


def _json_text(value: Mapping[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


# ---------------------------------------------------------------------------------------------
# two inputs


def find_divergences(a: InputRun, b: InputRun, policy: Policy) -> list[Divergence]:
    """What `codeclog diff` finds: two captures record by record, anything else by their
    replay reports under `policy`."""
    if a.source.kind is InputKind.CAPTURE and b.source.kind is InputKind.CAPTURE:
        return diff_captures(a.source.records, b.source.records)
    return diff_reports(a.results[policy].report, b.results[policy].report)


def divergence_mark(run: InputRun, policy: Policy, divergence: Divergence) -> int | None:
    """The mark where `divergence` sits in this input (None: stage level, or absent here)."""
    side = divergence.position_a if run.label == "A" else divergence.position_b
    rid, index = divergence.request_id, divergence.index
    if rid is None:
        return None
    if not side:  # no position here: a request the other input lacks starts at its first record
        if not divergence.what.startswith("request missing"):
            return None
        index = 0
    if side.startswith("outcome ") or (not side and run.source.kind is InputKind.SCENARIO):
        return run.timelines[policy].record_of_outcome(rid, index)  # the record that caused it
    records = [i for i, key in enumerate(_record_keys(run.source)) if key == rid]
    return records[index] if index < len(records) else None


def _record_keys(source: ReplayInput) -> list[str]:
    """The request key of every record, as `replay.diff` groups them."""
    return [
        NO_KEY if record.key is None else record.key.decode("utf-8", "backslashreplace")
        for record in source.records
    ]


# ---------------------------------------------------------------------------------------------
# audio


def _audio(run: InputRun) -> list[dict[str, Any]]:
    """Per request with audio: the tolerant clip, and the strict one where it differs."""
    tolerant = run.results[Policy.TOLERANT].pcm_by_request
    strict = run.results[Policy.STRICT].pcm_by_request
    clips = []
    for rid in sorted(set(tolerant) | set(strict)):
        main = _clip(tolerant.get(rid))
        other = _clip(strict.get(rid)) if strict.get(rid) != tolerant.get(rid) else None
        clips.append({"request": rid or NO_ID, "tolerant": main, "strict": other})
    return clips


def _clip(pcm: bytes | None) -> dict[str, Any] | None:
    if not pcm:
        return None
    clip: Clip = clip_of(pcm)
    return dataclasses.asdict(clip)
