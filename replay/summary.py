"""The human form of a replay report: a header, a per-request table and, under strict, the
upstream error the MiniCPM-o 4.5 Code2Wav stage would have died with."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from codeclog.schemas.records import SAMPLE_RATE_HZ
from codeclog.terminal_text import printable

UPSTREAM_ERROR = "MiniCPMO45Code2WavBatchError"
COLUMNS = ("request", "status", "windows", "audio_s", "rejections", "notes")
_NOTE_KINDS = ("gap", "duplicate", "abandoned", "hold", "marker")


def upstream_error_text(reason: str, details: Mapping[str, Any]) -> str:
    """The upstream's error text: the class name, then `{"reason": ..., **details}` with sorted
    keys and no spaces (e.g. `{"frames":1,"minimum":4,"reason":"chunk_below_lookahead_window"}`).
    """
    body = {**details, "reason": reason}
    return f"{UPSTREAM_ERROR} {json.dumps(body, sort_keys=True, separators=(',', ':'))}"


def format_summary(report: Mapping[str, Any]) -> str:
    """The report for a terminal: what came from the input (request ids, the capture's header)
    is shown with its control characters escaped (`codeclog.terminal_text`)."""
    lines = _header_lines(report)
    lines.append("")
    rows = [tuple(printable(cell) for cell in row) for row in request_rows(report)]
    lines.extend(_table([COLUMNS, *rows]))
    lines.extend(_dead_letter_lines(report))
    lines.extend(_fatal_lines(report))
    return "".join(printable(line) + "\n" for line in lines)


def _header_lines(report: Mapping[str, Any]) -> list[str]:
    source = report.get("input", {})
    lines = [f"replay of {source.get('name', '?')} ({source.get('kind', '?')})"]
    provenance = report.get("provenance")
    if provenance:
        lines.append(
            f"captured from topic {provenance['topic']} ({provenance['partition_count']} "
            f"partitions) on cluster {provenance['cluster_id']} by codeclog "
            f"{provenance['codeclog_version']} ({provenance['git_commit'][:12]})"
        )
    if source.get("truncated"):
        lines.append("warning: the capture's last block was torn (a crashed capture?)")
    skipped = source.get("skipped_blocks") or []
    if skipped:
        lines.append(
            f"warning: {len(skipped)} corrupt block(s) of the capture skipped, their records "
            f"missing from this replay: {'; '.join(skipped)}"
        )
    lines.append(
        f"policy {report.get('policy')}, vocoder {report.get('vocoder', 'none')}, "
        f"{report.get('events', 0)} events processed, {report.get('unprocessed', 0)} unprocessed"
    )
    if report.get("stream_limit"):
        lines.append(f"open streams: {report['stream_limit']}")
    if report.get("determinism_domain"):
        lines.append(f"audio determinism domain {report['determinism_domain']}")
    return lines


def request_rows(report: Mapping[str, Any]) -> list[tuple[str, ...]]:
    requests = report.get("requests", {})
    return [_row(request_id, requests[request_id]) for request_id in sorted(requests)]


def _row(request_id: str, entry: Mapping[str, Any]) -> tuple[str, ...]:
    outcomes = entry.get("outcomes", [])
    kinds = Counter(o.get("kind") for o in outcomes)
    rejections = Counter(o.get("reason") for o in outcomes if o.get("kind") == "reject")
    audio = entry.get("audio")
    audio_s = f"{audio['samples'] / SAMPLE_RATE_HZ:.2f}" if audio else "-"
    return (
        request_id or "<no id>",
        str(entry.get("status", "?")),
        str(kinds.get("decode", 0)),
        audio_s,
        _counts(rejections) or "-",
        _counts(Counter({k: kinds[k] for k in _NOTE_KINDS if kinds.get(k)})) or "-",
    )


def _counts(counter: Mapping[Any, int]) -> str:
    return " ".join(f"{key}={counter[key]}" for key in sorted(counter, key=str))


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _dead_letter_lines(report: Mapping[str, Any]) -> list[str]:
    dead = report.get("dead_letters") or {}
    if not dead.get("total"):
        return []
    return ["", f"dead letters: {dead['total']} ({_counts(dead.get('by_reason', {}))})"]


def _fatal_lines(report: Mapping[str, Any]) -> list[str]:
    fatal = (report.get("stage") or {}).get("fatal")
    if not fatal:
        return []
    request_id = fatal.get("request_id")
    killed = sorted(
        r for r, entry in report.get("requests", {}).items() if entry.get("status") == "killed"
    )
    return [
        "",
        f"stage: FATAL under strict at request {request_id}, epoch {fatal.get('cache_epoch')}, "
        f"seq {fatal.get('chunk_seq')}; the upstream Code2Wav stage would have raised",
        f"  {upstream_error_text(fatal['reason'], _fatal_details(report, fatal))}",
        f"  requests it would have killed: {', '.join(killed) or '-'}",
        f"  events left unprocessed: {report.get('unprocessed', 0)}",
    ]


def _fatal_details(report: Mapping[str, Any], fatal: Mapping[str, Any]) -> Mapping[str, Any]:
    """The details of the reject outcome that was fatal (the last reject of that request)."""
    entry = report.get("requests", {}).get(fatal.get("request_id"), {})
    for outcome in reversed(entry.get("outcomes", [])):
        if outcome.get("kind") == "reject" and outcome.get("reason") == fatal.get("reason"):
            return dict(outcome.get("details", {}))
    return {}
