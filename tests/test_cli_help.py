"""Every command's --help keeps the layout its text was written in (tables, examples), and
exits 0: a description or epilog with line breaks must not be re-wrapped into one paragraph."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from codeclog.cli import build_parser, main


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


PARSERS = list(_parsers(build_parser()))


def test_every_command_is_walked() -> None:
    paths = {path for path, _ in PARSERS}
    assert {("topics", "create"), ("acls", "apply"), ("broker", "start"), ("vocode",)} <= paths


@pytest.mark.parametrize(
    ("path", "parser"), PARSERS, ids=[" ".join(p) or "codeclog" for p, _ in PARSERS]
)
def test_help_with_line_breaks_is_printed_as_written(
    path: tuple[str, ...], parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    written = [text for text in (parser.description, parser.epilog) if text and "\n" in text]
    if written:
        assert issubclass(parser.formatter_class, argparse.RawDescriptionHelpFormatter), path
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    for text in written:
        first_line = next(line for line in text.splitlines() if line.strip())
        assert first_line.rstrip() in shown, (path, first_line)
