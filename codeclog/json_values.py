"""Typed reads of JSON that codeclog or a user wrote: each returns the value it checked or raises
`JsonValueError` (a ValueError) saying what was expected and what was there. README "Exit codes"."""

from __future__ import annotations

import json
from typing import Any


class JsonValueError(ValueError):
    """A JSON text or value is not what the reader expects."""


def json_value(text: str | bytes) -> Any:
    """The JSON value `text` holds (a text nested too deeply to read is refused too)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise JsonValueError("not JSON this reader accepts: nested too deeply") from None
    except ValueError as exc:
        raise JsonValueError(f"not JSON: {exc}") from None


def json_object(text: str | bytes) -> dict[str, Any]:
    """The JSON object `text` holds."""
    return json_dict(json_value(text))


def json_dict(value: Any) -> dict[str, Any]:
    """A JSON object (its keys are strings)."""
    if not isinstance(value, dict):
        raise JsonValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


def json_list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise JsonValueError(f"expected a list, got {_shown(value)}")
    return value


def json_int(value: Any) -> int:
    """An integer; JSON's true and false are not integers here."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise JsonValueError(f"expected an integer, got {_shown(value)}")
    return value


def json_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise JsonValueError(f"expected true or false, got {_shown(value)}")
    return value


def json_str(value: Any) -> str:
    """A string of Unicode text: JSON's `\\ud800` escapes can spell a lone surrogate, which is
    no character and cannot be written as UTF-8 (a Kafka key, a file, a terminal)."""
    if not isinstance(value, str):
        raise JsonValueError(f"expected a string, got {_shown(value)}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise JsonValueError(
                f"expected Unicode text, got a lone surrogate U+{ord(value[exc.start]):04X} "
                f"at character {exc.start}"
            ) from None
    return value


def _shown(value: Any) -> str:
    """A value in an error message: its repr, cut short (a value may be a whole document)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
