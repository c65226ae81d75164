"""`json.dumps(value, sort_keys=True, indent=1, ensure_ascii=False)`, byte for byte, faster.
Reasons: docs/replay.md, "Replay"."""

from __future__ import annotations

import json
from json.encoder import encode_basestring  # the C implementation when available
from typing import Any

_INT = int.__repr__
_FLOAT = float.__repr__
_INFINITY = float("inf")


class _Unusual(Exception):
    """A value this writer does not spell itself: json.dumps writes the whole text."""


def dumps_sorted_indent1(value: Any) -> str:
    """The text of `json.dumps(value, sort_keys=True, indent=1, ensure_ascii=False)`."""
    writer = _Writer()
    try:
        writer.write(value, 0)
    except (_Unusual, TypeError):  # TypeError: keys sorted() cannot order; json decides
        return json.dumps(value, sort_keys=True, indent=1, ensure_ascii=False)
    return "".join(writer.parts)


class _Writer:
    """One text's parts, with the strings that repeat (keys, indents) made once."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self._keys: dict[str, str] = {}  # key -> '"key": '
        self._indents: list[tuple[str, str, str]] = []  # level -> (open, separator, close)

    def _indent(self, level: int) -> tuple[str, str, str]:
        while len(self._indents) <= level:
            depth = len(self._indents)
            inner = "\n" + " " * (depth + 1)
            self._indents.append((inner, "," + inner, "\n" + " " * depth))
        return self._indents[level]

    def write(self, value: Any, level: int) -> None:
        kind = type(value)
        if kind is dict:
            self._dict(value, level)
        elif kind is list or kind is tuple:
            self._list(value, level)
        else:
            self.parts.append(_scalar(value))

    def _dict(self, value: dict[Any, Any], level: int) -> None:
        out = self.parts
        if not value:
            out.append("{}")
            return
        opening, separator, closing = self._indent(level)
        keys = self._keys
        out.append("{")
        joint = opening
        for key in sorted(value):
            prefix = keys.get(key)
            if prefix is None:
                if type(key) is not str:
                    raise _Unusual
                prefix = keys[key] = encode_basestring(key) + ": "
            out.append(joint)
            out.append(prefix)
            joint = separator
            self.write(value[key], level + 1)
        out.append(closing + "}")

    def _list(self, value: list[Any] | tuple[Any, ...], level: int) -> None:
        out = self.parts
        if not value:
            out.append("[]")
            return
        opening, separator, closing = self._indent(level)
        out.append("[")
        joint = opening
        for item in value:
            out.append(joint)
            joint = separator
            self.write(item, level + 1)
        out.append(closing + "]")


def _scalar(value: Any) -> str:
    kind = type(value)
    if kind is str:
        text: str = encode_basestring(value)
        return text
    if kind is int:
        return _INT(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if kind is float:
        if value != value:
            return "NaN"
        if value == _INFINITY:
            return "Infinity"
        if value == -_INFINITY:
            return "-Infinity"
        return _FLOAT(value)
    raise _Unusual
