"""Text from an input (a request id, a file name) shown on a terminal, what a terminal would act on
or cannot write escaped. Reasons: docs/security.md, "Text from the input on a terminal"."""

from __future__ import annotations

import unicodedata

_ESCAPED_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
_BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """`text` with what a terminal would act on escaped (`\\x1b`, `\\n`, `\\u202e`, ...)."""
    if text.isprintable():  # the common case: nothing to look at character by character
        return text
    return "".join(_shown(char) for char in text)


def _shown(char: str) -> str:
    if char in _SHORT:
        return _SHORT[char]
    category = unicodedata.category(char)
    if category == "Cs" and 0xDC80 <= ord(char) <= 0xDCFF:  # a byte os.fsdecode kept
        return f"\\x{ord(char) - 0xDC00:02x}"
    if category in _ESCAPED_CATEGORIES or char in _BIDI_CONTROLS:
        code = ord(char)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return char
