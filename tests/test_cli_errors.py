"""Command-line mistakes are one line on stderr and exit 2, never a traceback or an abort
(README, "Exit codes": 0 ok, 1 failure, 2 usage or configuration). No broker is needed: each
case is refused before anything connects. Run as subprocesses, since librdkafka used to abort
the whole interpreter on some of them (`vocode --group ""`: Consumer_init assertion, rc 134).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from codeclog.config import ENV_BOOTSTRAP, kafka_client_config

ROOT = Path(__file__).resolve().parents[1]
NOWHERE = ["--bootstrap", "127.0.0.1:1"]  # never contacted: every case fails before


def _codeclog(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "codeclog.cli", *argv],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
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
