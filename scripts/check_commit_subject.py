#!/usr/bin/env python3
"""The commit-msg hook: a commit's subject is at most 72 characters; the detail goes in the body.

The subject is what `git log --format=%s` prints: the message's first paragraph (its lines up to
the first blank one, joined by spaces), comment lines (`#`) left out as git leaves them out.
Subjects git writes for `commit --fixup`/`--squash` (`fixup! ...`, `squash! ...`, `amend! ...`)
pass: they disappear when the branch is rebased with --autosquash.

Usage: check_commit_subject.py MESSAGE_FILE (pre-commit passes .git/COMMIT_EDITMSG).
"""

from __future__ import annotations

import sys
from pathlib import Path

MAX_SUBJECT = 72
AUTOSQUASH = ("fixup! ", "squash! ", "amend! ")


def subject(message: str) -> str:
    """The subject of a commit message, as git prints it with %s."""
    lines = [line.rstrip() for line in message.splitlines() if not line.startswith("#")]
    while lines and not lines[0].strip():
        lines.pop(0)
    paragraph: list[str] = []
    for line in lines:
        if not line.strip():
            break
        paragraph.append(line.strip())
    return " ".join(paragraph)


def problem(message: str) -> str | None:
    """Why the message's subject is refused, or None."""
    text = subject(message)
    if text.startswith(AUTOSQUASH) or len(text) <= MAX_SUBJECT:
        return None
    return (
        f"commit subject is {len(text)} characters, at most {MAX_SUBJECT}: keep the subject "
        "short and put the detail in the body, after a blank line\n"
        f"  {text}"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_commit_subject.py MESSAGE_FILE", file=sys.stderr)
        return 2
    found = problem(Path(argv[0]).read_text(encoding="utf-8", errors="replace"))
    if found is None:
        return 0
    print(found, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
