"""Text from an input shown on a terminal: what a terminal would act on is escaped, the rest
kept (codeclog.terminal_text)."""

from __future__ import annotations

import os

import pytest

from codeclog.terminal_text import printable


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("session-0001", "session-0001"),
        ("naïve 日本語 🎧", "naïve 日本語 🎧"),
        ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),
        ("a\nb\tc\rd", "a\\nb\\tc\\rd"),
        ("\x9b31m\x7f", "\\x9b31m\\x7f"),
        ("abc\u202egnp.exe", "abc\\u202egnp.exe"),
        ("\u2028", "\\u2028"),
        ("\ud800", "\\ud800"),
        (os.fsdecode(b"\xff\xfe.jsonl"), "\\xff\\xfe.jsonl"),
    ],
    ids=["plain", "unicode", "osc", "whitespace", "c1_del", "bidi", "separator", "surrogate",
         "file_name_bytes"],
)  # fmt: skip
def test_printable(text: str, shown: str) -> None:
    assert printable(text) == shown
    printable(text).encode("utf-8")  # always writable
