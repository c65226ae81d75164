"""`codeclog report`'s work: check the output, load the inputs, build the page, write it.
Its errors: docs/report.md, "Errors"."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from codeclog.replay.errors import InputFormatError, ReplayError, ReplayOptionError
from codeclog.replay.inputs import ReplayInput, load_input
from codeclog.replay.report.model import ReportOptions, build_page, run_input
from codeclog.replay.report.render import render_page
from codeclog.user_files import check_replaceable
from codeclog.version import __version__

LABELS = ("A", "B")


class ReportWriteError(ReplayError):
    """The report could not be written after its path was checked (exit 1)."""


@dataclasses.dataclass(frozen=True)
class WrittenReport:
    path: Path
    size_bytes: int
    records: int  # over every input
    requests: int  # distinct request ids, over every input
    fatal: str  # the strict policy's verdict on the first input, in a few words
    skipped_blocks: int = 0  # corrupt capture blocks skipped, over every input


def load_report_input(path: str | Path, skip_corrupt_blocks: bool = False) -> ReplayInput:
    """A capture or a scenario with at least one record."""
    source = load_input(path, skip_corrupt_blocks)
    if not (source.records or source.events):
        raise InputFormatError(f"{path} holds no records: there is nothing to report")
    return source


def write_report(inputs: Sequence[str | Path], out: Path, options: ReportOptions) -> WrittenReport:
    if not 1 <= len(inputs) <= len(LABELS):
        raise ReplayOptionError(f"give one or two inputs, not {len(inputs)}")
    target = check_replaceable(out, "--out file", inputs)
    sources = [load_report_input(path, options.skip_corrupt_blocks) for path in inputs]
    runs = [
        run_input(label, source, options) for label, source in zip(LABELS, sources, strict=False)
    ]
    page = build_page(runs, options, __version__)
    data = render_page(page).encode("utf-8")
    _write_atomically(target, data)
    fatal = page["inputs"][0]["fatal"]
    return WrittenReport(
        out,
        len(data),
        records=sum(len(view["marks"]["row"]) for view in page["inputs"]),
        requests=len({rid for view in page["inputs"] for rid in view["rows"]}),
        fatal=f"strict dies with {fatal['reason']} at {fatal['request_id']}" if fatal else "",
        skipped_blocks=sum(len(source.skipped) for source in sources),
    )


def _write_atomically(path: Path, data: bytes) -> None:
    """Write beside `path`, then rename: a reader never sees half a report. A file replaced
    keeps its permissions; a new one gets what a plain open() would have given it."""
    temporary = None
    try:
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask()
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".report-", delete=False) as tmp:
            temporary = Path(tmp.name)
            tmp.write(data)
        temporary.chmod(mode)  # not NamedTemporaryFile's 0600
        os.replace(temporary, path)
    except OSError as exc:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        raise ReportWriteError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
