"""`codeclog lag` / `codeclog lag-exporter` argument handling (no cluster needed)."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from codeclog.cli.commands import lag as lag_command
from codeclog.errors import EXIT_USAGE


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="codeclog")
    lag_command.register(root.add_subparsers(dest="command"))
    return root


def test_defaults() -> None:
    args = parser().parse_args(["lag"])
    assert args.group == "codeclog-vocoder"
    assert args.samples == 1 and not args.check and not args.watch
    config = lag_command.evaluator_config(args)
    assert config.window_samples == 10 and config.stuck_after_ms == 30_000
    assert (config.max_time_lag_s, config.max_audio_lag_s) == (3.0, 5.0)
    assert args.offset_reset == "earliest"


def test_threshold_flags() -> None:
    argv = ["lag", "--max-time-lag", "1.5", "--max-audio-lag", "2", "--offset-reset", "latest"]
    args = parser().parse_args(argv)
    config = lag_command.evaluator_config(args)
    assert (config.max_time_lag_s, config.max_audio_lag_s) == (1.5, 2.0)
    assert args.offset_reset == "latest"


def test_exporter_defaults_and_repeated_groups() -> None:
    args = parser().parse_args(["lag-exporter", "--group", "a", "--group", "b"])
    assert args.port == 9310 and args.groups == ["a", "b"]
    assert args.samples == 0  # run until interrupted


@pytest.mark.parametrize(
    "argv",
    [
        ["lag", "--check", "--watch"],
        ["lag", "--samples", "0"],
        ["lag", "--interval", "0"],
        ["lag", "--read-records", "-1"],
        ["lag", "--offset-reset", "none"],
        ["lag", "--max-audio-lag", "-1"],
        ["lag-exporter", "--samples", "-1"],
    ],
    ids=[
        "check_and_watch",
        "zero_samples",
        "zero_interval",
        "negative_read_records",
        "unknown_offset_reset",
        "negative_threshold",
        "exporter_negative_samples",
    ],
)
def test_refused_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["lag", "lag-exporter"])
def test_help_teaches(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args([command, "--help"])
    out = capsys.readouterr().out
    assert "example" in out and "--group" in out
    assert "--max-time-lag" in out and "--max-audio-lag" in out


def test_help_documents_thresholds_and_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["lag", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "reset position" in out and "does not exist" in out
    assert "exit status: 0 OK; 1" in out and "2 usage or configuration" in out


def test_bad_rule_settings_are_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    args = parser().parse_args(["lag", "--window", "1", "--bootstrap", "127.0.0.1:1"])
    assert args.func(args) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("codeclog lag: window_samples must be >= 2") and "Traceback" not in err


def test_unreachable_cluster_is_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    args = parser().parse_args(["lag", "--bootstrap", "127.0.0.1:1", "--timeout-s", "0.5"])
    assert args.func(args) == lag_command.EXIT_FAILURE
    err = capsys.readouterr().err.strip()
    assert err.startswith("codeclog lag: cannot reach the cluster")
    assert "\n" not in err


def test_bad_client_property_is_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    properties = tmp_path / "client.properties"
    properties.write_text("no.such.property=1\n")
    argv = ["lag", "--bootstrap", "127.0.0.1:1", "--kafka-config", str(properties)]
    args = parser().parse_args(argv)
    assert args.func(args) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"codeclog lag: --kafka-config {properties}: No such configuration")
    assert "Traceback" not in err and err.count("\n") == 1


def test_port_in_use_is_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["lag-exporter", "--bootstrap", "127.0.0.1:1", "--address", "127.0.0.1"]
        args = parser().parse_args([*argv, "--port", str(port), "--samples", "1"])
        assert args.func(args) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"codeclog lag-exporter: cannot serve metrics on 127.0.0.1:{port}")
