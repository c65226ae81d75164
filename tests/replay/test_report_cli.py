"""`codeclog report` on the command line: a report is written (the same bytes every time), and
bad input is one line on stderr with the README's exit codes: 2 for an input that cannot be
read, is neither a capture nor a scenario or holds no record, and for an --out that cannot be
written; 1 for a write that fails after that."""

from __future__ import annotations

import errno
import io
import json
import os
import random
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from codeclog.cli import main
from codeclog.replay.synthetic import metadata_for, write_capture
from codeclog.testing.upstream_streams import realistic_events

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


# ----------------------------------------------------------------------------- issue 41
# --out: only a new file or a regular one that is none of the inputs, replaced atomically.


def _report(run_cli: RunCli, out: Path | str, *inputs: Path | str) -> tuple[int, str, str]:
    return run_cli(["report", *map(str, inputs or (SCENARIO,)), "--out", str(out)])


def test_an_out_that_is_the_input_is_refused_and_the_input_kept(
    tmp_path: Path, run_cli: RunCli
) -> None:
    """It replaced the capture with the page: the incident was gone."""
    scenario = tmp_path / "incident.jsonl"
    scenario.write_bytes(SCENARIO.read_bytes())
    link, hard = tmp_path / "link.html", tmp_path / "hard.html"
    link.symlink_to(scenario)
    os.link(scenario, hard)
    for out in (scenario, link, hard, tmp_path / "." / "incident.jsonl"):
        _one_line(_report(run_cli, out, scenario), 2, f"is the input {scenario}")
    assert scenario.read_bytes() == SCENARIO.read_bytes() and link.is_symlink()


def test_an_out_that_is_the_second_input_is_refused(tmp_path: Path, run_cli: RunCli) -> None:
    second = tmp_path / "b.jsonl"
    second.write_bytes(SCENARIO.read_bytes())
    _one_line(_report(run_cli, second, SCENARIO, second), 2, f"is the input {second}")


@pytest.fixture
def device(tmp_path: Path) -> Path:
    """A character device of this test's own (the null device's numbers, 1:3): as root, the
    old `report` replaced /dev/null itself with a regular file; a test must never risk that
    with the machine's own."""
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    return node


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda out, _: os.mkfifo(out), "is a pipe, not a regular file"),
        (lambda out, node: out.symlink_to(node), "is a character device, not a regular file"),
        (lambda out, _: out.mkdir(), "is a directory"),
    ],
    ids=["fifo", "symlink_to_a_device", "folder"],
)
def test_an_out_that_is_not_a_regular_file_is_refused_and_left_alone(
    make: Callable[[Path, Path], object],
    message: str,
    device: Path,
    tmp_path: Path,
    run_cli: RunCli,
) -> None:
    out = tmp_path / "out"
    make(out, device)
    _one_line(_report(run_cli, out), 2, message)
    assert device.is_char_device()


def test_a_device_is_refused_and_left_alone(device: Path, run_cli: RunCli) -> None:
    """As root, `--out /dev/null` replaced the device with a regular file."""
    _one_line(_report(run_cli, device), 2, f"{device}: is a character device")
    assert device.is_char_device()


def test_a_read_only_out_is_refused_even_for_root(tmp_path: Path, run_cli: RunCli) -> None:
    out = tmp_path / "r.html"
    out.write_text("kept")
    out.chmod(0o444)
    _one_line(_report(run_cli, out), 2, "is read-only")
    assert out.read_text() == "kept"


def test_a_regular_out_is_replaced_atomically_keeping_its_mode(
    tmp_path: Path, run_cli: RunCli
) -> None:
    out = tmp_path / "r.html"
    out.write_text("old page")
    out.chmod(0o640)
    before = out.stat().st_ino
    assert _report(run_cli, out)[0] == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert out.stat().st_ino != before, "a new file renamed over the old one"
    assert out.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_a_symlink_out_replaces_the_file_it_names(tmp_path: Path, run_cli: RunCli) -> None:
    target, link = tmp_path / "pages" / "r.html", tmp_path / "latest.html"
    target.parent.mkdir()
    link.symlink_to(target)  # dangling: the page is a new file there
    assert _report(run_cli, link)[0] == 0
    assert link.is_symlink() and target.read_text().startswith("<!DOCTYPE html>")


def test_an_out_name_too_long_is_one_line(tmp_path: Path, run_cli: RunCli) -> None:
    """It was an OSError traceback (ENAMETOOLONG)."""
    _one_line(_report(run_cli, tmp_path / ("a" * 300 + ".html")), 2, "file name too long")


# ----------------------------------------------------------------------------- inputs


def test_a_pipe_input_is_read_once(tmp_path: Path, run_cli: RunCli) -> None:
    """`report <(cat file)` said "holds no records": the format sniff consumed the pipe."""
    for source in (SCENARIO, _capture_file(tmp_path)):
        read_end, write_end = os.pipe()
        os.write(write_end, source.read_bytes())  # fits the pipe's buffer
        os.close(write_end)
        try:
            code, out, err = _report(run_cli, tmp_path / "p.html", f"/dev/fd/{read_end}")
        finally:
            os.close(read_end)
        assert (code, err) == (0, ""), err
        assert "6 records" in out or "30 records" in out, out


def _capture_file(tmp_path: Path) -> Path:
    from tests.replay.captures import write_events

    events = realistic_events(random.Random(5), sessions=1, turns=3)[:30]
    write_events(tmp_path / "c.ocf", events, 2, block_records=10)
    return tmp_path / "c.ocf"


def test_a_pipe_larger_than_the_bound_is_refused(
    tmp_path: Path, run_cli: RunCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("codeclog.replay.inputs.MAX_PIPE_BYTES", 100)
    read_end, write_end = os.pipe()
    os.write(write_end, SCENARIO.read_bytes())
    os.close(write_end)
    try:
        result = _report(run_cli, tmp_path / "p.html", f"/dev/fd/{read_end}")
    finally:
        os.close(read_end)
    _one_line(result, 2, "the pipe holds more than")


def test_a_read_error_on_the_input_is_one_line(tmp_path: Path, run_cli: RunCli) -> None:
    """A read error was an OSError traceback. /proc/self/mem answers EIO at address 0: a real
    read error with no FUSE and no fault injection (/dev/zero: tests/test_cli_errors.py)."""
    result = _report(run_cli, tmp_path / "r.html", "/proc/self/mem")
    _one_line(result, 2, "cannot read input /proc/self/mem: input/output error")


def test_a_bad_second_input_is_named(tmp_path: Path, run_cli: RunCli) -> None:
    torn = tmp_path / "torn.ocf"
    torn.write_bytes(b"Obj\x01\x02garbage")
    result = _report(run_cli, tmp_path / "r.html", SCENARIO, torn)
    _one_line(result, 2, f"{torn}: not a readable Avro capture")


def test_a_corrupt_block_is_an_error_unless_skipped_and_counted(
    tmp_path: Path, run_cli: RunCli
) -> None:
    """It was exit 0, the page showing the records before it as "a torn last block"."""
    import fastavro

    capture = _capture_file(tmp_path)
    data = bytearray(capture.read_bytes())
    block = list(fastavro.block_reader(io.BytesIO(bytes(data))))[1]
    data[block.offset + block.size // 2] ^= 0x20
    capture.write_bytes(bytes(data))
    out = tmp_path / "r.html"
    _one_line(_report(run_cli, out, capture), 2, f"block #2 (at byte {block.offset}) is corrupt")
    code, printed, err = run_cli(
        ["report", str(capture), "--out", str(out), "--skip-corrupt-blocks"]
    )
    assert (
        (code, err) == (0, "") and "20 records" in printed and "1 corrupt block skipped" in printed
    )
    page = out.read_text()
    assert "1 corrupt block of the capture skipped" in page and f"at byte {block.offset}" in page
    for argv in (["replay", str(capture)], ["replay", str(capture), "--json"]):
        _, _, err = result = run_cli(argv)
        assert result[0] == 2 and f"block #2 (at byte {block.offset})" in err
    code, printed, _ = run_cli(["replay", str(capture), "--skip-corrupt-blocks"])
    assert code == 0 and "1 corrupt block(s) of the capture skipped" in printed
    code, printed, _ = run_cli(["replay", str(capture), "--skip-corrupt-blocks", "--json"])
    assert code == 0 and len(json.loads(printed)["input"]["skipped_blocks"]) == 1


# ----------------------------------------------------------------------------- terminal, vocoder


def test_request_ids_with_escape_sequences_are_printed_escaped(
    tmp_path: Path, run_cli: RunCli
) -> None:
    """A request id "\\x1b]0;owned\\x07" retitled the terminal of whoever ran report or replay."""
    rid = "\x1b]0;owned\x07\x1b[2J"
    scenario = tmp_path / "esc.jsonl"
    scenario.write_text(json.dumps({"request_id": rid, "codes": [1]}) + "\n")  # strict dies
    _, printed, _ = _report(run_cli, tmp_path / "r.html", scenario)
    assert "\x1b" not in printed and "at \\x1b]0;owned\\x07\\x1b[2J" in printed
    for policy in ("strict", "tolerant"):
        _, printed, _ = run_cli(["replay", str(scenario), "--policy", policy])
        assert "\x1b" not in printed and "\x07" not in printed
        assert "\\x1b]0;owned\\x07\\x1b[2J" in printed


@pytest.mark.parametrize("command", ["report", "replay"])
def test_a_vocoder_that_does_not_exist_is_a_configuration_error(
    command: str, tmp_path: Path, run_cli: RunCli
) -> None:
    """It was exit 1 (vocode says exit 2 for the same)."""
    argv = [command, str(SCENARIO), "--vocoder", str(tmp_path / "nonexistent")]
    argv += ["--out", str(tmp_path / "r.html")] if command == "report" else []
    code, _, err = run_cli(argv)
    assert code == 2 and err.count("\n") == 1 and "cannot load the vocoder" in err, err
