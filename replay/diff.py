"""The first divergence per request between two captures or two replay reports.
What is compared: docs/replay.md, "Diff"."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from codeclog.replay.capture_format import CapturedRecord, is_capture_file, read_capture
from codeclog.replay.errors import InputFormatError
from codeclog.replay.inputs import log_order

NO_KEY = "<no key>"


@dataclasses.dataclass(frozen=True, slots=True)
class Divergence:
    """Where two inputs first differ for one request (or for the whole stage)."""

    request_id: str | None  # None for a stage-level difference (policy, counts, fatal)
    index: int  # record index within the request (captures) or outcome index (reports)
    what: str  # human-readable: which field differs and how
    position_a: str = ""  # e.g. "p3@1207" or "outcome 5"; "" when absent on that side
    position_b: str = ""
    cache_epoch: int | None = None
    chunk_seq: int | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        if self.request_id is None:
            return f"stage: {self.what}"
        seq = "" if self.chunk_seq is None else f", epoch {self.cache_epoch} seq {self.chunk_seq}"
        sides = f"A {self.position_a or '-'} / B {self.position_b or '-'}"
        return f"request {self.request_id!r}: #{self.index} ({sides}{seq}): {self.what}"


def diff_paths(path_a: str | Path, path_b: str | Path) -> list[Divergence]:
    """Both captures, or both JSON reports (`codeclog replay --json` output)."""
    a_capture, b_capture = is_capture_file(path_a), is_capture_file(path_b)
    if a_capture != b_capture:
        raise InputFormatError("cannot compare a capture with a report: give two of a kind")
    if a_capture:
        return diff_captures(read_capture(path_a)[1], read_capture(path_b)[1])
    return diff_reports(_load_report(Path(path_a)), _load_report(Path(path_b)))


def _load_report(path: Path) -> dict[str, Any]:
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputFormatError(f"{path} is neither a capture nor a JSON replay report") from exc
    if not isinstance(report, dict) or "requests" not in report:
        raise InputFormatError(f"{path} is JSON but not a replay report (no 'requests')")
    return report


# ---------------------------------------------------------------------------------------------
# captures


def by_request(records: Sequence[CapturedRecord]) -> dict[str, list[CapturedRecord]]:
    grouped: dict[str, list[CapturedRecord]] = defaultdict(list)
    for record in log_order(records):
        key = NO_KEY if record.key is None else record.key.decode("utf-8", "backslashreplace")
        grouped[key].append(record)
    return dict(grouped)


def diff_captures(a: Sequence[CapturedRecord], b: Sequence[CapturedRecord]) -> list[Divergence]:
    groups_a, groups_b = by_request(a), by_request(b)
    found = []
    for request_id in sorted(set(groups_a) | set(groups_b)):
        divergence = _first_record_divergence(
            request_id, groups_a.get(request_id, []), groups_b.get(request_id, [])
        )
        if divergence is not None:
            found.append(divergence)
    return found


def _first_record_divergence(
    request_id: str, a: Sequence[CapturedRecord], b: Sequence[CapturedRecord]
) -> Divergence | None:
    for index in range(max(len(a), len(b))):
        left = a[index] if index < len(a) else None
        right = b[index] if index < len(b) else None
        what = _record_difference(left, right)
        if what is not None:
            epoch, seq = _stream_position(left if left is not None else right)
            return Divergence(
                request_id, index, what, _position(left), _position(right), epoch, seq
            )
    return None


def _position(record: CapturedRecord | None) -> str:
    return "" if record is None else f"p{record.partition}@{record.offset}"


def _record_difference(a: CapturedRecord | None, b: CapturedRecord | None) -> str | None:
    if a is None or b is None:
        return f"record missing in {'A' if a is None else 'B'}"
    if a.value == b.value:
        return None
    fields = _decoded_fields_differing(a.value, b.value)
    return f"value differs: {fields}" if fields else "value bytes differ"


def _decoded_fields_differing(a: bytes | None, b: bytes | None) -> str:
    left, right = _decoded(a), _decoded(b)
    if left is None or right is None or type(left) is not type(right):
        return ""
    pairs = [
        (f.name, getattr(left, f.name), getattr(right, f.name)) for f in dataclasses.fields(left)
    ]
    return ", ".join(f"{n} {_short(x)} vs {_short(y)}" for n, x, y in pairs if x != y)


def _decoded(value: bytes | None) -> Any:
    from codeclog.schemas.wire import DecodeError, decode

    try:
        return decode(value)
    except DecodeError:
        return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _stream_position(record: CapturedRecord | None) -> tuple[int | None, int | None]:
    decoded = _decoded(record.value) if record is not None else None
    epoch = getattr(decoded, "cache_epoch", None)
    seq = getattr(decoded, "chunk_seq", None)
    return epoch, seq


# ---------------------------------------------------------------------------------------------
# reports

_STAGE_KEYS = ("policy", "events", "unprocessed")


def diff_reports(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Divergence]:
    found = _stage_divergences(a, b)
    requests_a, requests_b = a.get("requests", {}), b.get("requests", {})
    for request_id in sorted(set(requests_a) | set(requests_b)):
        divergence = _first_request_divergence(
            request_id, requests_a.get(request_id), requests_b.get(request_id)
        )
        if divergence is not None:
            found.append(divergence)
    return found


def _stage_divergences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Divergence]:
    found = [
        Divergence(None, 0, f"{key} {a.get(key)!r} vs {b.get(key)!r}")
        for key in _STAGE_KEYS
        if a.get(key) != b.get(key)
    ]
    fatal_a = (a.get("stage") or {}).get("fatal")
    fatal_b = (b.get("stage") or {}).get("fatal")
    if fatal_a != fatal_b:
        text_a, text_b = (json.dumps(f, sort_keys=True) for f in (fatal_a, fatal_b))
        found.append(Divergence(None, 0, f"stage.fatal {text_a} vs {text_b}"))
    return found


def _first_request_divergence(
    request_id: str, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None
) -> Divergence | None:
    if a is None or b is None:
        return Divergence(request_id, 0, f"request missing in {'A' if a is None else 'B'}")
    outcomes = _first_outcome_divergence(request_id, a.get("outcomes", []), b.get("outcomes", []))
    if outcomes is not None:
        return outcomes
    if a.get("status") != b.get("status"):
        return Divergence(request_id, 0, f"status {a.get('status')} vs {b.get('status')}")
    if a.get("audio") != b.get("audio"):
        return Divergence(request_id, 0, f"audio {_audio_difference(a, b)}")
    return None


def _first_outcome_divergence(
    request_id: str, a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]
) -> Divergence | None:
    for index in range(max(len(a), len(b))):
        left = a[index] if index < len(a) else None
        right = b[index] if index < len(b) else None
        if left == right:
            continue
        probe = left if left is not None else right or {}
        return Divergence(
            request_id,
            index,
            _outcome_difference(left, right),
            "" if left is None else f"outcome {index}",
            "" if right is None else f"outcome {index}",
            probe.get("cache_epoch"),
            _outcome_seq(probe),
        )
    return None


def _outcome_seq(outcome: Mapping[str, Any]) -> int | None:
    if "chunk_seq" in outcome:
        return int(outcome["chunk_seq"])
    seqs = outcome.get("chunk_seqs")
    return int(seqs[-1]) if seqs else None


def _outcome_difference(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> str:
    if a is None:
        return f"outcome missing in A ({(b or {}).get('kind')})"
    if b is None:
        return f"outcome missing in B ({a.get('kind')})"
    keys = sorted(set(a) | set(b))
    parts = [f"{k} {_short(a.get(k))} vs {_short(b.get(k))}" for k in keys if a.get(k) != b.get(k)]
    return f"{a.get('kind')}: " + ", ".join(parts)


def _audio_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    left, right = a.get("audio") or {}, b.get("audio") or {}
    keys = sorted(set(left) | set(right))
    return ", ".join(
        f"{k} {_short(left.get(k))} vs {_short(right.get(k))}"
        for k in keys
        if left.get(k) != right.get(k)
    )
