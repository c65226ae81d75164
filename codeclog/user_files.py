"""Files and folders the user names (`--kafka-config`, `--out`, a replay input, ...), read and
written with one-line errors and exit 2. Reasons: README, "Exit codes"."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
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
    folder is missing or not a folder, `path` is a folder, or its name is too long."""
    target = Path(path)
    folder = target.parent
    problem: OSError | None = None
    try:
        if target.is_dir():
            problem = IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
        elif not folder.is_dir():
            code = errno.ENOTDIR if folder.exists() else errno.ENOENT
            problem = OSError(code, os.strerror(code), str(folder))
        elif not os.access(folder, os.W_OK):
            problem = PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(folder))
    except OSError as exc:  # a name too long, a loop of symbolic links
        problem = exc
    if problem is not None:
        raise user_file_error("write", what, path, problem)


def check_replaceable(path: str | Path, what: str, inputs: Sequence[str | Path] = ()) -> Path:
    """Where to write the file the user named `path`, checked before any slow work: a new file,
    or a regular file to replace (a symbolic link is followed to the file it names). Refused:
    a folder, anything that is not a regular file (a device such as /dev/null, a pipe), a
    read-only file, and one of the command's `inputs` (the same file by device and inode,
    whatever names lead to it)."""
    target = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    try:
        found: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        found = None
    except OSError as exc:
        raise user_file_error("write", what, path, exc) from exc
    problem = None if found is None else _not_replaceable(found, target, inputs)
    if problem is not None:
        raise UserFileError(f"cannot write {what} {path}: {problem}")
    check_creatable(target, what)
    return target


def _not_replaceable(
    found: os.stat_result, target: Path, inputs: Sequence[str | Path]
) -> str | None:
    if stat.S_ISDIR(found.st_mode):
        return "is a directory"
    if not stat.S_ISREG(found.st_mode):
        return f"is {file_kind(found.st_mode)}, not a regular file; it is not replaced"
    for name in inputs:
        try:
            other = os.stat(name)
        except OSError:
            continue  # the input's own error comes when it is read
        if (other.st_dev, other.st_ino) == (found.st_dev, found.st_ino):
            return f"is the input {name}; an input is never overwritten"
    # no write bit at all: read-only even for root, whom os.access always lets write
    if not found.st_mode & 0o222 or not os.access(target, os.W_OK):
        return "is read-only"
    return None


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in a few words ("a character device")."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"
