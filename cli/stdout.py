"""Standard output that cannot be written, handled once for every command (README, "Exit codes")."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from typing import Any

from codeclog.errors import EXIT_BROKEN_PIPE, EXIT_FAILURE


class StdoutError(Exception):
    """Writing to standard output failed; `error` is the system's."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


class _Guarded:
    """A stream whose write and flush errors are StdoutErrors; everything else is the stream's.
    While a command runs, `sys.stdout` (and its binary `buffer`) is one, so the entry point can
    tell an error of standard output from an error on any other file."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: Any) -> int:
        try:
            return int(self._stream.write(data))
        except OSError as exc:
            raise StdoutError(exc) from exc

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise StdoutError(exc) from exc

    @property
    def buffer(self) -> _Guarded:
        return _Guarded(self._stream.buffer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdout() -> Iterator[_Guarded]:
    """`sys.stdout` guarded for the duration, then restored (tests call the CLI in-process)."""
    original = sys.stdout
    guard = _Guarded(original)
    sys.stdout = guard
    try:
        yield guard
    finally:
        sys.stdout = original


def stdout_failed(failure: StdoutError, command: str, finished: int | None) -> int:
    """The exit code for a standard output that failed, after saying why (unless the reader
    simply left); `finished` is the command's own code if it had finished.

    The reader leaving (`codeclog broker net | head -1`: EPIPE) stops the command quietly, as
    SIGPIPE stops the Unix tools: exit 141 (128 + SIGPIPE, as a shell reports them), or the
    command's own exit code when it had already finished and only its last buffered lines were
    refused (`codeclog diff a b | head -1` still tells whether they differ). Any other error (a
    full disk, `> /dev/full`: ENOSPC; EIO) is one line and exit 1. Either way standard output is
    then pointed at /dev/null, so the interpreter's last flush of what is still buffered cannot
    fail again on the way out (it would print "Exception ignored ..." and exit 120)."""
    _point_stdout_at_devnull()
    if failure.error.errno == errno.EPIPE:
        return EXIT_BROKEN_PIPE if finished is None else finished
    text = failure.error.strerror or type(failure.error).__name__
    print(
        f"{command}: cannot write to standard output: {text[:1].lower()}{text[1:]}",
        file=sys.stderr,
    )
    return EXIT_FAILURE


def _point_stdout_at_devnull() -> None:
    try:
        descriptor = sys.stdout.fileno()
    except (OSError, ValueError):  # not a real file (a test's capture): nothing to flush later
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, descriptor)
    finally:
        os.close(devnull)
