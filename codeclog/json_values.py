"""Typed reads of JSON that codeclog or a user wrote (a scenario line, a checkpoint's fold state,
a topics config, a state file): each returns the value it checked or raises `JsonValueError`
(a ValueError) whose message says what was expected and what was there, so every reader words
the same mistake the same way and its caller only adds where it was.
"""

from __future__ import annotations

import json
from typing import Any


class JsonValueError(ValueError):
    """A JSON text or value is not what the reader expects."""


def json_object(text: str | bytes) -> dict[str, Any]:
    """The JSON object `text` holds."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise JsonValueError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise JsonValueError(f"expected a JSON object, got {type(raw).__name__}")
    return raw


def json_int(value: Any) -> int:
    """An integer; JSON's true and false are not integers here."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise JsonValueError(f"expected an integer, got {value!r}")
    return value


def json_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise JsonValueError(f"expected true or false, got {value!r}")
    return value


def json_str(value: Any) -> str:
    if not isinstance(value, str):
        raise JsonValueError(f"expected a string, got {value!r}")
    return value
