"""Command-line mistakes are one line on stderr and exit 2, never a traceback or an abort
(README, "Exit codes": 0 ok, 1 failure, 2 usage or configuration). No broker is needed: each
case is refused before anything connects. Run as subprocesses, since librdkafka used to abort
the whole interpreter on some of them (`vocode --group ""`: Consumer_init assertion, rc 134).
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from codeclog.cli.config import ENV_BOOTSTRAP, kafka_client_config

ROOT = Path(__file__).resolve().parents[1]
NOWHERE = ["--bootstrap", "127.0.0.1:1"]  # never contacted: every case fails before


def _codeclog(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # without $CODECLOG_BOOTSTRAP (set to reuse a dev broker): with --bootstrap as well, the CLI
    # adds a line saying which address it used, and these cases count lines
    inherited = {k: v for k, v in os.environ.items() if k != ENV_BOOTSTRAP}
    return subprocess.run(
        [sys.executable, "-m", "codeclog.cli", *argv],
        cwd=ROOT,
        env={**inherited, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        yield busy.getsockname()[1]


@pytest.fixture(scope="module")
def bad_configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("kafka-config")
    files = {
        "bad_value": "security.protocol=banana\n",
        "unknown_property": "no.such.property=1\n",
    }
    paths = {}
    for name, text in files.items():
        paths[name] = folder / f"{name}.properties"
        paths[name].write_text(text)
    return paths


def _assert_one_line_exit_2(result: subprocess.CompletedProcess[str], expected: str) -> None:
    err = result.stderr
    assert result.returncode == 2, (result.returncode, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert expected in err, err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["vocode", "--group", ""], "--group must not be empty"),
        (["vocode", "--metrics-port", "99999"], "--metrics-port must be a TCP port"),
        (["vocode", "--hift", "causal", "--batching", "ragged"], "--hift causal batches exact"),
        (["vocode", "--dtype", "float16"], "half precision is for CUDA"),
    ],
    ids=["empty_group", "port_out_of_range", "causal_ragged", "cpu_float16"],
)
def test_vocode_refuses_impossible_options(argv: list[str], expected: str) -> None:
    _assert_one_line_exit_2(_codeclog(*argv, *NOWHERE), expected)


def test_vocode_metrics_port_in_use(busy_port: int) -> None:
    result = _codeclog("vocode", "--metrics-port", str(busy_port), *NOWHERE)
    _assert_one_line_exit_2(result, f"cannot serve metrics on port {busy_port}")


@pytest.mark.parametrize("command", ["talk", "vocode", "lag"])
@pytest.mark.parametrize("case", ["bad_value", "unknown_property"])
def test_a_bad_kafka_config_is_one_line_and_exit_2(
    command: str, case: str, bad_configs: dict[str, Path]
) -> None:
    path = bad_configs[case]
    result = _codeclog(command, "--kafka-config", str(path), *NOWHERE)
    expected = "banana" if case == "bad_value" else "no.such.property"
    _assert_one_line_exit_2(result, f"--kafka-config {path}:")
    assert expected in result.stderr


def _args(**values: object) -> argparse.Namespace:
    return argparse.Namespace(
        **{"bootstrap": None, "kafka_config": None, "data_dir": None, **values}
    )


def test_kafka_config_bootstrap_wins_over_the_environment_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    properties = tmp_path / "client.properties"
    properties.write_text("bootstrap.servers=file-host:9092\nclient.id=x\n")
    monkeypatch.setenv(ENV_BOOTSTRAP, "env-host:9092")
    config = kafka_client_config(_args(kafka_config=str(properties)))
    assert config["bootstrap.servers"] == "file-host:9092"
    err = capsys.readouterr().err
    assert f"file-host:9092 from bootstrap.servers in {properties}" in err
    assert "ignoring $CODECLOG_BOOTSTRAP (env-host:9092)" in err
    # --bootstrap wins over both
    config = kafka_client_config(_args(kafka_config=str(properties), bootstrap="cli-host:1"))
    assert config["bootstrap.servers"] == "cli-host:1"
    assert "from --bootstrap; ignoring bootstrap.servers" in capsys.readouterr().err
    # the same address from two sources: nothing to say
    monkeypatch.setenv(ENV_BOOTSTRAP, "file-host:9092")
    kafka_client_config(_args(kafka_config=str(properties)))
    assert capsys.readouterr().err == ""


def test_vocode_against_an_unreachable_cluster_is_one_line_and_exit_1() -> None:
    """It used to take 34 s and print ~90 raw librdkafka lines before `_TIMED_OUT`."""
    import time

    started = time.monotonic()
    result = _codeclog("vocode", "--bootstrap", "127.0.0.1:1")
    took = time.monotonic() - started
    err = result.stderr
    assert result.returncode == 1, err
    assert "Traceback" not in err and "FAIL" not in err and "%3|" not in err, err
    assert err.count("\n") == 1, err
    assert err.startswith("codeclog vocode: no answer from the cluster at 127.0.0.1:1 within 10 s")
    assert took < 90, took  # the 10 s check plus start-up (41 s seen with both cores busy)


# ----------------------------------------------------------------------------- issue 29
# Each case was a traceback or another exit code before; the expected line is the contract.

SCENARIO = ROOT / "tests" / "data" / "scenarios" / "01_clean_turn.jsonl"
KAFKA_CONFIG_COMMANDS = [
    ["talk"],
    ["vocode"],
    ["verify"],
    ["listen"],
    ["capture", "--out", "{tmp}/x.ocf"],
    ["replay", str(SCENARIO), "--to-topic", "t"],
    ["lag"],
    ["lag-exporter"],
    ["topics", "create"],
    ["topics", "list"],
    ["acls", "apply"],
]


@pytest.mark.parametrize(
    "argv", KAFKA_CONFIG_COMMANDS, ids=lambda argv: "_".join(a for a in argv[:2] if "/" not in a)
)
def test_a_kafka_config_that_is_not_text_is_one_line_and_exit_2(
    argv: list[str], tmp_path: Path
) -> None:
    binary = tmp_path / "client.properties"
    binary.write_bytes(b"\xff\xfe\x00security.protocol=SSL\n")
    filled = [arg.format(tmp=tmp_path) for arg in argv]
    result = _codeclog(*filled, "--kafka-config", str(binary), *NOWHERE)
    _assert_one_line_exit_2(
        result, f"cannot read --kafka-config {binary}: not UTF-8 text (byte 0xff at offset 0)"
    )


def test_lag_exporter_port_out_of_range_is_one_line_and_exit_2() -> None:
    result = _codeclog("lag-exporter", "--port", "70000", *NOWHERE)
    _assert_one_line_exit_2(result, "--port must be a TCP port (0-65535), got 70000")


def test_verify_against_an_unreachable_cluster_is_one_line_and_exit_1() -> None:
    """It printed ~600 raw librdkafka lines, then a KafkaException traceback."""
    result = _codeclog("verify", *NOWHERE)
    err = result.stderr
    assert result.returncode == 1, err
    assert "Traceback" not in err and "%3|" not in err and "FAIL" not in err, err
    assert err.count("\n") == 1, err
    assert err.startswith("codeclog verify: no answer from the cluster at 127.0.0.1:1 within"), err


def test_broker_start_with_an_impossible_node_count_is_exit_2(tmp_path: Path) -> None:
    result = _codeclog("broker", "start", "--nodes", "0", "--data-dir", str(tmp_path / "d"))
    _assert_one_line_exit_2(result, "a local cluster has 2..9 nodes, not 0")


@pytest.fixture
def not_a_folder(tmp_path: Path) -> Path:
    """A regular file where a folder is expected: creating anything below it fails for every
    user, root included."""
    path = tmp_path / "file"
    path.write_text("")
    return path


def test_listen_out_that_cannot_be_created_names_the_path(not_a_folder: Path) -> None:
    """It printed a bare `[Errno 2] No such file or directory: '/proc/forbidden'`."""
    out = not_a_folder / "x"
    result = _codeclog("listen", "--out", str(out), *NOWHERE)
    _assert_one_line_exit_2(
        result, f"cannot create --out folder {out}: not a directory ({not_a_folder})"
    )


def test_capture_out_in_a_missing_folder_is_exit_2_like_listen(tmp_path: Path) -> None:
    """It exited 1 (after asking the cluster) where listen exits 2 for the same mistake."""
    out = tmp_path / "missing" / "x.ocf"
    result = _codeclog("capture", "--out", str(out), *NOWHERE)
    _assert_one_line_exit_2(
        result, f"cannot write --out file {out}: no such file or directory ({out.parent})"
    )


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (os.mkfifo, "is a pipe, not a regular file; it is not replaced"),
        (
            lambda path: os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3)),
            "is a character device",
        ),
    ],
)
def test_capture_out_that_is_not_a_regular_file_is_refused_and_left_alone(
    make: Callable[[Path], None], problem: str, tmp_path: Path
) -> None:
    """capture opened any --out for writing: a pipe blocked it forever, a device (as root, a
    /dev/null node) was truncated or replaced."""
    out = tmp_path / "out"
    make(out)
    mode = out.stat().st_mode
    result = _codeclog("capture", "--out", str(out), *NOWHERE)
    _assert_one_line_exit_2(result, f"cannot write --out file {out}: {problem}")
    assert out.stat().st_mode == mode


@pytest.mark.parametrize("case", ["missing", "folder", "binary"])
@pytest.mark.parametrize("command", ["replay", "diff"])
def test_replay_and_diff_agree_on_an_input_they_cannot_use(
    command: str, case: str, tmp_path: Path
) -> None:
    """The same unreadable input was exit 1 for replay and 2 for diff."""
    path = tmp_path / "input"
    expected = {
        "missing": f"cannot read input {path}: no such file or directory",
        "folder": f"cannot read input {path}: is a directory",
        "binary": f"{path} is neither a capture",
    }[case]
    if case == "folder":
        path.mkdir()
    elif case == "binary":
        path.write_bytes(b"\xff\xfe\x00\x01")
    argv = [command, str(path)] + ([str(path)] if command == "diff" else [])
    _assert_one_line_exit_2(_codeclog(*argv), expected)


def test_replay_options_that_do_not_go_together_are_exit_2() -> None:
    result = _codeclog("replay", str(SCENARIO), "--wav-dir", "w")
    _assert_one_line_exit_2(result, "--wav-dir needs audio")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["demo", "--out", "{bad}/x", *NOWHERE], "cannot create --out folder {bad}/x"),
        (
            ["replay", str(SCENARIO), "--vocoder", "tiny", "--wav-dir", "{bad}/x"],
            "cannot create --wav-dir folder {bad}/x",
        ),
        (["broker", "start", "--data-dir", "{bad}/x"], "cannot create the data dir {bad}/x"),
        (
            ["broker", "start", "--nodes", "3", "--data-dir", "{bad}/x"],
            "cannot create the data dir {bad}/x",
        ),
    ],
    ids=["demo_out", "replay_wav_dir", "broker_data_dir", "cluster_data_dir"],
)
def test_folders_that_cannot_be_created_are_one_line_and_exit_2(
    argv: list[str], expected: str, not_a_folder: Path
) -> None:
    """demo --out was a traceback; replay --wav-dir exit 1 after the whole replay; the data
    dir of broker start exit 1."""
    result = _codeclog(*[arg.format(bad=not_a_folder) for arg in argv])
    _assert_one_line_exit_2(result, expected.format(bad=not_a_folder))


# ----------------------------------------------------------------------------- issue 41
# Standard output that cannot be written, input that is not text, names that are not UTF-8:
# each was a traceback.


def _codeclog_bytes(
    *argv: str | bytes, stdout: int | None = None, memory_bytes: int | None = None
) -> tuple[int, str]:
    """(exit code, stderr) of `codeclog` with argv as bytes where given (a name that is not
    UTF-8) and stdout where given; stdout buffered, as Python buffers a pipe or a file; its
    address space bounded to `memory_bytes` where given."""
    unset = (ENV_BOOTSTRAP, "PYTHONUNBUFFERED")
    inherited = {k: v for k, v in os.environ.items() if k not in unset}
    done = subprocess.run(
        [sys.executable, "-m", "codeclog.cli", *argv],
        cwd=ROOT,
        env=inherited,
        stdout=subprocess.DEVNULL if stdout is None else stdout,
        stderr=subprocess.PIPE,
        timeout=120,
        preexec_fn=None if memory_bytes is None else lambda: _bound_memory(memory_bytes),
    )
    return done.returncode, done.stderr.decode("utf-8", "backslashreplace")


def _bound_memory(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.parametrize("command", ["replay", "report"])
def test_an_endless_input_is_refused_not_read(command: str, tmp_path: Path) -> None:
    """/dev/zero was read until MemoryError. Bounded to 2 GB here, so that reading it cannot
    take the machine's memory should it ever be read again."""
    argv = [command, "/dev/zero"] + (
        ["--out", str(tmp_path / "r.html")] if command == "report" else []
    )
    code, err = _codeclog_bytes(*argv, memory_bytes=2 << 30)
    assert code == 2 and err.count("\n") == 1, err
    assert err.endswith("cannot read input /dev/zero: a character device, not a file or a pipe\n")


@pytest.mark.parametrize(
    "argv",
    [["replay", str(SCENARIO)], ["report", str(SCENARIO), "--out", "{tmp}/r.html"], ["--help"]],
    ids=["replay", "report", "help"],
)
def test_stdout_on_a_full_disk_is_one_line_and_exit_1(argv: list[str], tmp_path: Path) -> None:
    with open("/dev/full", "wb") as full:
        code, err = _codeclog_bytes(*(a.format(tmp=tmp_path) for a in argv), stdout=full.fileno())
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.endswith(": cannot write to standard output: no space left on device\n"), err


def test_stdout_whose_reader_left_stops_quietly(tmp_path: Path) -> None:
    """`codeclog ... | head -1`: no traceback, no message. Refused at the last flush, the
    command's own code (`broker status` still says "stopped"); refused while it runs (a report
    too long for the buffer), 141."""
    big = tmp_path / "big.jsonl"
    lines = (f'{{"request_id": "r{i}", "codes": [1, 2, 3, 4, 5]}}\n' for i in range(300))
    big.write_text("".join(lines))
    for argv, expected in (
        (["replay", str(SCENARIO)], 0),
        (["broker", "status", "--data-dir", str(tmp_path / "none")], 3),  # "stopped"
        (["replay", str(big), "--json"], 141),
    ):
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before anything is written
        try:
            code, err = _codeclog_bytes(*argv, stdout=write_end)
        finally:
            os.close(write_end)
        assert (code, err) == (expected, ""), (argv, code, err)


def test_a_file_name_that_is_not_utf8_works_and_is_shown_escaped(tmp_path: Path) -> None:
    """The report's page (and `wrote NAME`) failed to encode the name: a traceback."""
    name = os.fsencode(tmp_path) + b"/\xff\xfe.jsonl"
    Path(os.fsdecode(name)).write_bytes(SCENARIO.read_bytes())
    read_end, write_end = os.pipe()
    code, err = _codeclog_bytes("report", name, "--out", str(tmp_path / "r.html"), stdout=write_end)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as printed:
        out = printed.read().decode()
    assert (code, err) == (0, ""), err
    assert out.startswith("wrote ") and "\\xff\\xfe.jsonl" not in out  # the output's own name
    assert "\\xff\\xfe.jsonl" in (tmp_path / "r.html").read_text()
    missing = os.fsencode(tmp_path) + b"/\xff-missing.jsonl"
    code, err = _codeclog_bytes("replay", missing)
    assert code == 2 and err.count("\n") == 1 and "\\xff-missing.jsonl" in err, err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"request_id": "\\ud800", "codes": [1]}', "lone surrogate U+D800"),
        ('{"request_id": "a", "codes": [1], "llm_output_text_utf8": "\\udc00"}', "U+DC00"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
    ids=["request_id_surrogate", "text_surrogate", "nested_100000_deep"],
)
def test_a_scenario_line_that_cannot_be_an_event_is_one_line(
    line: str, message: str, tmp_path: Path
) -> None:
    """UnicodeEncodeError and RecursionError tracebacks."""
    scenario = tmp_path / "s.jsonl"
    scenario.write_text(line + "\n")
    _assert_one_line_exit_2(_codeclog("replay", str(scenario)), message)
