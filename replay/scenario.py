"""Human-readable captures: one JSON object per line, in arrival order (tests/data/scenarios/).
The lines: docs/replay.md, "Replay"."""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from codeclog.errors import CodeclogError
from codeclog.json_values import JsonValueError, json_bool, json_int, json_object, json_str
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind
from codeclog.user_files import reason

Event = CodecChunk | ControlEvent
COMMENT_KEY = "comment"
CONTROL_KEY = "control"


class ScenarioError(CodeclogError):
    """A scenario line is not a valid event. `line` is 1-based (0: the file itself)."""

    def __init__(self, path: str | Path, line: int, message: str) -> None:
        self.path = str(path)
        self.line = line
        super().__init__(f"{path}:{line}: {message}" if line else f"{path}: {message}")


def read_scenario(path: str | Path) -> list[Event]:
    """Every event of a JSONL scenario file, in order."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(path, 0, f"cannot read scenario: {reason(path, exc)}") from exc
    return parse_scenario(text.splitlines(), path)


def parse_scenario(lines: Iterable[str], source: str | Path = "<scenario>") -> list[Event]:
    events: list[Event] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = parse_line(line)
        except JsonValueError as exc:
            raise ScenarioError(source, number, str(exc)) from None
        if event is not None:
            events.append(event)
    return events


def parse_line(line: str) -> Event | None:
    """One event from one JSON line; None for a comment. Raises JsonValueError (a ValueError)."""
    raw = json_object(line)
    raw.pop(COMMENT_KEY, None)
    if not raw:
        return None
    if CONTROL_KEY in raw:
        return _control(raw)
    return _chunk(raw)


def _check_keys(raw: dict[str, Any], known: Iterable[str], what: str) -> None:
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise JsonValueError(f"unknown {what} field(s): {', '.join(unknown)}")


def _control(raw: dict[str, Any]) -> ControlEvent:
    _check_keys(
        raw, (CONTROL_KEY, "request_id", "reason", "produced_at_ms", "producer_id"), "control"
    )
    kinds = {kind.value: kind for kind in ControlKind}
    kind = raw[CONTROL_KEY]
    if kind not in kinds:
        raise JsonValueError(f"control must be one of {', '.join(kinds)}, got {kind!r}")
    return ControlEvent(
        request_id=_get(raw, "request_id", json_str, ""),
        kind=kinds[kind],
        reason=_get(raw, "reason", json_str, ""),
        produced_at_ms=_get(raw, "produced_at_ms", json_int, 0),
        producer_id=_get(raw, "producer_id", json_str, ""),
    )


def _chunk(raw: dict[str, Any]) -> CodecChunk:
    _check_keys(raw, _CHUNK_PARSERS, "codec chunk")
    if "codes" not in raw:
        raise JsonValueError("a codec chunk needs `codes` (or write a control or comment line)")
    values = {name: parse(raw[name]) for name, parse in _CHUNK_PARSERS.items() if name in raw}
    values.setdefault("request_id", "")  # missing: the fold rejects it (S1/T1)
    return CodecChunk(**values)


def _get(raw: dict[str, Any], key: str, parse: Callable[[Any], Any], default: Any) -> Any:
    return parse(raw[key]) if key in raw else default


def _optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else parse(value)


def _duplex_id(value: Any) -> int:
    """The upstream meta carries `int or None`; None means absent, i.e. -1."""
    return -1 if value is None else json_int(value)


def _request_id(value: Any) -> str:
    return "" if value is None else json_str(value)


def _codes(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise JsonValueError(f"codes must be a list of integers, got {value!r}")
    return tuple(json_int(code) for code in value)


def _text(value: Any) -> bytes:
    if isinstance(value, str):
        return json_str(value).encode("utf-8")
    if isinstance(value, list) and all(0 <= json_int(byte) <= 255 for byte in value):
        return bytes(value)
    raise JsonValueError(f"llm_output_text_utf8 must be a string or a list of bytes, got {value!r}")


def _samples(value: Any) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise JsonValueError(f"ref_audio must be a list of float samples, got {value!r}")
    samples = [_float(sample) for sample in value]
    return struct.pack(f"<{len(samples)}f", *samples)


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise JsonValueError(f"expected a finite number, got {value!r}")
    return float(value)


_CHUNK_PARSERS: dict[str, Callable[[Any], Any]] = {
    "request_id": _request_id,
    "codes": _codes,
    "cache_epoch": json_int,
    "chunk_seq": json_int,
    "code_flat_numel": _optional(json_int),
    "codec_chunk_frames": json_int,
    "codec_left_context_frames": json_int,
    "last_chunk": json_bool,
    "tts_is_last_chunk": json_bool,
    "turn_end": json_bool,
    "duplex_epoch": _duplex_id,
    "duplex_turn_id": _duplex_id,
    "llm_output_text_utf8": _text,
    "segment_end": json_bool,
    "ref_audio": _samples,
    "ref_audio_sr": _optional(json_int),
    "prompt_cache_id": _optional(json_str),
    "produced_at_ms": json_int,
    "producer_id": json_str,
}


def event_to_json(event: Event) -> dict[str, Any]:
    """The scenario-line object of an event (the inverse of `parse_line`; defaults omitted)."""
    if isinstance(event, ControlEvent):
        line: dict[str, Any] = {CONTROL_KEY: event.kind.value, "request_id": event.request_id}
        defaults = ControlEvent(event.request_id, event.kind)
        extra = {k: getattr(event, k) for k in ("reason", "produced_at_ms", "producer_id")}
        return line | {k: v for k, v in extra.items() if v != getattr(defaults, k)}
    default = CodecChunk(request_id=event.request_id, codes=event.codes)
    line = {"request_id": event.request_id, "codes": list(event.codes)}
    for field in dataclasses.fields(CodecChunk):
        value = getattr(event, field.name)
        if field.name not in line and value != getattr(default, field.name):
            line[field.name] = _json_value(field.name, value)
    return line


def _json_value(name: str, value: Any) -> Any:
    if name == "llm_output_text_utf8":
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return list(value)
    if name == "ref_audio" and value is not None:
        return list(struct.unpack(f"<{len(value) // 4}f", value[: len(value) // 4 * 4]))
    return value


def write_scenario(path: str | Path, events: Iterable[Event]) -> None:
    lines = [json.dumps(event_to_json(event), sort_keys=True) for event in events]
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
