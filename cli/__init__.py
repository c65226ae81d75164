"""The `codeclog` command: one entry point, one module per subcommand.
How a command is added: docs/cli.md, "Adding a command"."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from codeclog.cli.stdout import StdoutError, guarded_stdout, stdout_failed
from codeclog.errors import EXIT_INTERRUPTED, EXIT_USAGE, CodeclogError, exit_code
from codeclog.terminal_text import printable
from codeclog.version import __version__

COMMANDS: tuple[str, ...] = (
    "codeclog.cli.commands.broker",
    "codeclog.cli.commands.topics",
    "codeclog.cli.commands.acls",
    "codeclog.cli.commands.talk",
    "codeclog.cli.commands.vocode",
    "codeclog.cli.commands.verify",
    "codeclog.cli.commands.listen",
    "codeclog.cli.commands.capture",
    "codeclog.cli.commands.replay",
    "codeclog.cli.commands.diff",
    "codeclog.cli.commands.report",
    "codeclog.cli.commands.lag",
    "codeclog.cli.commands.demo",
)

DESCRIPTION = """\
codeclog moves MiniCPM-o 4.5 talker codec chunks to the Token2wav (Code2Wav) vocoder over a
Kafka log: typed Avro records, a pure per-request fold, batched GPU decode with exactly-once
audio output, deterministic offline replay and lag alerting.

Typical session:
  codeclog broker start              # a real single-node Kafka on 127.0.0.1
  codeclog topics create             # codec.chunks, codec.audio, codec.dlq, ...
  codeclog talk --sessions 4 --seconds 20 --realtime
  codeclog vocode --vocoder tiny     # the Code2Wav consumer
  codeclog lag --watch               # consumer lag in records, seconds and audio seconds
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="codeclog",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"codeclog {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMANDS:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    command = "codeclog"
    code: int | None = None  # the command's exit code, once it has finished
    with guarded_stdout() as stdout:
        try:
            try:
                args = parser.parse_args(argv)
                command = command_name(args) if args.command else command
                code = _run(parser, args)
            finally:
                stdout.flush()  # what is still buffered fails here, not at the interpreter's exit
        except StdoutError as exc:  # one rule for every command (codeclog.cli.stdout)
            return stdout_failed(exc, command, code)
    assert code is not None  # parse_args exits (SystemExit) rather than return without one
    return code


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(func(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except CodeclogError as exc:  # one rule for every command (README, "Exit codes")
        message = printable(" ".join(str(exc).split()))
        print(f"{command_name(args)}: {message}", file=sys.stderr)
        return exit_code(exc)


def command_name(args: argparse.Namespace) -> str:
    """`codeclog topics create`: the command and, for one with actions, the action."""
    action = getattr(args, f"{args.command}_action", None)
    return f"codeclog {args.command}" + (f" {action}" if action else "")
