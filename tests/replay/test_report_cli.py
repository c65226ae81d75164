"""`codeclog report` on the command line: a report is written (the same bytes every time), and
bad input is one line on stderr with the README's exit codes: 2 for an input that cannot be
read, is neither a capture nor a scenario or holds no record, and for an --out that cannot be
written; 1 for a write that fails after that."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from codeclog.cli import main
from codeclog.replay.synthetic import metadata_for, write_capture

RunCli = Callable[[Sequence[str]], tuple[int, str, str]]
SCENARIO = (
    Path(__file__).resolve().parents[1]
    / "data"
    / "scenarios"
    / "03_boundary_placeholder_stripped.jsonl"
)


def test_a_report_is_written_and_the_same_every_time(tmp_path: Path, run_cli: RunCli) -> None:
    first, second = tmp_path / "1.html", tmp_path / "2.html"
    code, out, err = run_cli(["report", str(SCENARIO), "--out", str(first)])
    assert (code, err) == (0, "")
    assert out == (
        f"wrote {first} ({first.stat().st_size / 1e6:.2f} MB): 6 records, 2 requests; "
        "strict dies with chunk_below_lookahead_window at b\n"
    )
    assert run_cli(["report", str(SCENARIO), "--out", str(second)])[0] == 0
    assert first.read_bytes() == second.read_bytes()


def test_two_inputs_are_one_report(tmp_path: Path, run_cli: RunCli) -> None:
    other = SCENARIO.with_name("01_clean_turn.jsonl")
    code, out, _ = run_cli(["report", str(SCENARIO), str(other), "--out", str(tmp_path / "r.html")])
    assert code == 0 and "9 records, 3 requests" in out


def test_help_names_the_inputs_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["report", "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    for word in ("INPUT2", "--out", "--policy", "--vocoder", "--kernels", "offline", "exit status"):
        assert word in shown


def _one_line(result: tuple[int, str, str], code: int, message: str) -> None:
    exit_code, _out, err = result
    assert exit_code == code, err
    assert err.startswith("codeclog report: ") and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.ocf", None, "cannot read input"),
        ("empty.jsonl", b"", "holds no records"),
        ("comments.jsonl", b'{"comment": "nothing else"}\n', "holds no records"),
        ("binary.bin", b"\x00\xff\xfe garbage", "neither a capture file"),
        ("torn.ocf", b"Obj\x01\x02garbage", "not a readable Avro capture"),
    ],
)
def test_an_unusable_input_is_one_line_and_exit_2(
    name: str, content: bytes | None, message: str, tmp_path: Path, run_cli: RunCli
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    _one_line(run_cli(["report", str(path), "--out", str(tmp_path / "r.html")]), 2, message)


def test_an_empty_capture_is_one_line_and_exit_2(tmp_path: Path, run_cli: RunCli) -> None:
    path = tmp_path / "empty.ocf"
    write_capture(path, [], metadata_for([], partitions=2))
    result = run_cli(["report", str(path), "--out", str(tmp_path / "r.html")])
    _one_line(result, 2, "holds no records")


@pytest.mark.parametrize(
    ("out", "message"),
    [("no/such/folder/r.html", "no such file or directory"), (".", "is a directory")],
)
def test_an_output_that_cannot_be_written_is_refused_first(
    out: str, message: str, tmp_path: Path, run_cli: RunCli
) -> None:
    _one_line(run_cli(["report", str(SCENARIO), "--out", str(tmp_path / out)]), 2, message)


def test_a_second_input_that_is_unusable_is_named(tmp_path: Path, run_cli: RunCli) -> None:
    missing = tmp_path / "nope.jsonl"
    result = run_cli(["report", str(SCENARIO), str(missing), "--out", str(tmp_path / "r.html")])
    _one_line(result, 2, str(missing))


def test_a_write_that_fails_is_one_line_and_exit_1(
    tmp_path: Path, run_cli: RunCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(*_args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("codeclog.replay.report.writer.os.replace", disk_full)
    result = run_cli(["report", str(SCENARIO), "--out", str(tmp_path / "r.html")])
    _one_line(result, 1, "No space left on device")
    assert list(tmp_path.iterdir()) == [], "no half-written report or temporary file is left"
