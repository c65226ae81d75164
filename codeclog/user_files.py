"""Files and folders the user names (`--kafka-config`, `--out`, a replay input, ...): failing to
read, write or create one is the user's to fix, so it is one line naming the path and what is
wrong, and exit 2 (README, "Exit codes"), never a traceback and never exit 1.

Every command reads and writes such paths through these functions, so the wording is the same
everywhere: `cannot <verb> <what> <path>: <reason>`, e.g.
`cannot create --out folder /proc/x/y: no such file or directory (/proc/x)`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

from codeclog.errors import UsageError


class UserFileError(UsageError):
    """A file or folder the user named cannot be read, written or created (exit 2)."""


def reason(path: str | Path, exc: OSError | UnicodeDecodeError) -> str:
    """What is wrong, in a few words: the system's reason, with the path it concerns when that
    is another one (a missing parent folder), or where the text stops being UTF-8."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
    text = exc.strerror or type(exc).__name__
    text = text[:1].lower() + text[1:]
    where = exc.filename
    if exc.errno == errno.ENOTDIR:  # the system names the path asked for, not the file in the way
        where = _file_in_the_way(Path(path)) or where
    if where is not None and os.fspath(where) != os.fspath(path):
        text += f" ({os.fsdecode(where)})"
    return text


def _file_in_the_way(path: Path) -> Path | None:
    """The nearest ancestor of `path` that exists and is not a folder."""
    for ancestor in path.parents:
        if ancestor.exists():
            return None if ancestor.is_dir() else ancestor
    return None


def user_file_error(
    verb: str, what: str, path: str | Path, exc: OSError | UnicodeDecodeError
) -> UserFileError:
    """The one wording: `cannot <verb> <what> <path>: <reason>`."""
    return UserFileError(f"cannot {verb} {what} {path}: {reason(path, exc)}")


def read_text(path: str | Path, what: str) -> str:
    """The whole file as UTF-8 text."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise user_file_error("read", what, path, exc) from exc


def open_binary(path: str | Path, what: str) -> BinaryIO:
    """The file opened for reading bytes (the caller closes it)."""
    try:
        return open(path, "rb")
    except OSError as exc:
        raise user_file_error("read", what, path, exc) from exc


def create_binary(path: str | Path, what: str) -> BinaryIO:
    """The file created (or truncated) for writing bytes; its folder must exist."""
    try:
        return open(path, "wb")
    except OSError as exc:
        raise user_file_error("write", what, path, exc) from exc


def make_folder(path: str | Path, what: str) -> Path:
    """The folder, created with its parents when missing."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise user_file_error("create", what, path, exc) from exc
    return folder


def check_creatable(path: str | Path, what: str) -> None:
    """Raise now, before any slow work, when a file could not be created at `path` later: its
    folder is missing or not a folder, or `path` is a folder."""
    target = Path(path)
    folder = target.parent
    problem: OSError | None = None
    if target.is_dir():
        problem = IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
    elif not folder.is_dir():
        code = errno.ENOTDIR if folder.exists() else errno.ENOENT
        problem = OSError(code, os.strerror(code), str(folder))
    elif not os.access(folder, os.W_OK):
        problem = PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(folder))
    if problem is not None:
        raise user_file_error("write", what, path, problem)
