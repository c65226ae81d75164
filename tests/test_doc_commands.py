"""Every command shown in README.md and docs/ is one that works: each `codeclog ...` line of a
code block parses with the real parser, each inline `codeclog ...` names a real command and
real options, each `make X` is a Makefile target and each `python -m X` module exists.

A line or span holding a placeholder in angle brackets (`codeclog <command> --help`) is not a
command and is skipped; so is `...` standing for an option's value."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from codeclog.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

PLACEHOLDER = re.compile(r"<[^<>\s][^<>]*>")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"(?<!`)`((?:[^`\n]|\n(?!\s*\n))+)`(?!`)")  # may wrap, not a paragraph
COMMENT = re.compile(r"(^|\s)#.*$")
SHELL_SPLIT = re.compile(r"&&|\|\||;|\$\(|\)|\s\|\s")
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")
MAKE = re.compile(r"(?:^|[\s=;&(])make\s+([A-Za-z][\w-]*)")
PYTHON_M = re.compile(r"python3?\s+-m\s+([A-Za-z_][\w.]*)")


@dataclass(frozen=True)
class Shown:
    """A piece of code shown in a document: where, and whether it is a whole line."""

    doc: str
    line: int
    text: str
    whole: bool  # a code block's line (a full command) or an inline span (may be a fragment)

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def shown_code(path: Path) -> Iterator[Shown]:
    """Every code block line and every inline code span of a Markdown file."""
    text = path.read_text()
    name = str(path.relative_to(ROOT))
    blocks = list(FENCE.finditer(text))
    for block in blocks:
        first = _line_of(text, block.start(1))
        for i, line in enumerate(block.group(1).splitlines()):
            if line.strip():
                yield Shown(name, first + i, line.strip(), whole=True)
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for span in INLINE.finditer(prose):
        text_of_span = " ".join(span.group(1).split())
        yield Shown(name, _line_of(prose, span.start()), text_of_span, whole=False)


def codeclog_commands(code: str) -> list[list[str]]:
    """The `codeclog` invocations of one shell line, each as its arguments after `codeclog`."""
    commands = []
    for segment in SHELL_SPLIT.split(COMMENT.sub("", code)):
        words = segment.split()
        if words[:1] == ["export"]:
            words = words[1:]
        while words and ENV_ASSIGNMENT.match(words[0]):
            words = words[1:]
        if words[:1] == ["codeclog"] and not (len(words) > 1 and words[1].endswith(":")):
            # (`codeclog talk: ...` is a message the CLI prints, not a command)
            commands.append(shlex.split(" ".join(words[1:])))
    return commands


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def check_whole(argv: list[str]) -> str | None:
    """None when the real parser takes this command line, else argparse's message."""
    parser = build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):  # --help and --version exit 0
            return err.getvalue().strip().splitlines()[-1] if err.getvalue() else str(exc)
    return None


def check_fragment(argv: list[str]) -> str | None:
    """An inline mention such as `codeclog replay --policy strict`: the words name a command
    (alternatives as `kill|pause`) and every --option is one of that command's options."""
    parsers = [build_parser()]
    rest = list(argv)
    while rest and (subs := _subparsers(parsers[0])):
        names = rest[0].split("|")
        if not all(name in subs for name in names):
            if rest[0].startswith("-"):
                break
            return f"no command {rest[0]!r} (have: {', '.join(subs)})"
        parsers = [subs[name] for name in names]
        rest.pop(0)
    for word in rest:
        option = word.split("=", 1)[0]
        if not option.startswith("--"):
            continue
        for parser in parsers:
            if option not in parser._option_string_actions:
                return f"{parser.prog} has no option {option}"
    return None


def check_command(shown: Shown, argv: list[str]) -> str | None:
    return check_whole(argv) if shown.whole else check_fragment(argv)


def _all_shown() -> list[Shown]:
    return [shown for path in DOCS for shown in shown_code(path)]


CODE = [shown for shown in _all_shown() if not PLACEHOLDER.search(shown.text)]
COMMANDS = [
    (shown, argv)
    for shown in CODE
    for argv in codeclog_commands(shown.text if shown.whole else shown.text.replace("...", ""))
]


def test_the_documents_show_commands() -> None:
    # a broken extractor would test nothing: the README alone shows more than ten
    assert len([c for c in COMMANDS if c[0].doc == "README.md"]) >= 10
    assert len([c for c in COMMANDS if c[0].whole]) >= 40
    assert len([c for c in COMMANDS if not c[0].whole]) >= 20


@pytest.mark.parametrize(("shown", "argv"), COMMANDS, ids=[str(c[0]) for c in COMMANDS])
def test_every_codeclog_command_shown_parses(shown: Shown, argv: list[str]) -> None:
    problem = check_command(shown, argv)
    assert problem is None, f"{shown}\n  -> {problem}"


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


def test_every_make_target_shown_exists() -> None:
    targets = _makefile_targets()
    shown = [(s, m) for s in CODE for m in MAKE.findall(COMMENT.sub("", s.text))]
    assert any(m == "demo" for _, m in shown)
    missing = [f"{s}: make {m}" for s, m in shown if m not in targets]
    assert not missing, "\n".join(missing)


def test_every_python_module_shown_exists() -> None:
    shown = [(s, m) for s in CODE for m in PYTHON_M.findall(COMMENT.sub("", s.text))]
    assert any(m.startswith("bench.") for _, m in shown)
    missing = [f"{s}: python -m {m}" for s, m in shown if importlib.util.find_spec(m) is None]
    assert not missing, "\n".join(missing)


# The checks themselves fail on a broken command (a test that cannot fail proves nothing).


@pytest.mark.parametrize(
    ("line", "whole"),
    [
        ("codeclog vocode --no-such-option", True),
        ("codeclog no-such-command", True),
        ("codeclog replay", True),  # its INPUT is required
        ("`codeclog replay --no-such-option` in prose", False),
        ("codeclog broker kill|frobnicate --node 2", False),
    ],
)
def test_a_broken_command_is_caught(line: str, whole: bool) -> None:
    shown = Shown("probe", 1, line.strip("`"), whole)
    [argv] = codeclog_commands(shown.text.split("`")[0] if not whole else shown.text)
    assert check_command(shown, argv) is not None


def test_commands_are_found_inside_shell_lines() -> None:
    line = "export CODECLOG_BOOTSTRAP=$(codeclog broker start)   # a comment: codeclog nothing"
    assert codeclog_commands(line) == [["broker", "start"]]
    assert codeclog_commands("codeclog a --x && codeclog b") == [["a", "--x"], ["b"]]
    assert codeclog_commands("X=1 codeclog lag --check") == [["lag", "--check"]]
    assert codeclog_commands("make demo") == []
    assert codeclog_commands("codeclog talk: User:x is not authorised ...") == []
