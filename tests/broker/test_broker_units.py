"""Pure parts of the local broker: ports, cluster ids, properties, java versions, state, CLI."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codeclog.cli import main
from codeclog.cli.broker_tables import format_status
from codeclog.devtools.broker import BrokerSettings, BrokerState, BrokerStatusKind, LocalBroker
from codeclog.devtools.broker_config import (
    BrokerPorts,
    choose_ports,
    new_cluster_id,
    parse_listener_ports,
    render_server_properties,
)
from codeclog.devtools.broker_errors import BrokerError
from codeclog.devtools.cluster import local_bootstrap
from codeclog.devtools.jars import (
    KAFKA_VERSION,
    REQUIRED_JARS,
    JarCacheInvalidError,
    first_maven_error,
    runtime_file,
    verify_libs,
)
from codeclog.devtools.jvm import parse_java_major, telling_line

# ----------------------------------------------------------------------------- ports

PREVIOUS = BrokerPorts(41000, 41001)


def _picker(*ports: int) -> Callable[[], int]:
    sequence = iter(ports)
    return lambda: next(sequence)


@pytest.mark.parametrize(
    ("case", "previous", "taken", "picks", "expected"),
    [
        ("first start picks two ports", None, set(), (50000, 50001), BrokerPorts(50000, 50001)),
        ("restart reuses free ports", PREVIOUS, set(), (50000, 50001), PREVIOUS),
        ("broker port taken", PREVIOUS, {41000}, (50000, 50001), BrokerPorts(50000, 50001)),
        ("controller port taken", PREVIOUS, {41001}, (50000, 50001), BrokerPorts(50000, 50001)),
        ("same port picked twice", None, set(), (50000, 50000, 50002), BrokerPorts(50000, 50002)),
    ],
)
def test_choose_ports(
    case: str,
    previous: BrokerPorts | None,
    taken: set[int],
    picks: tuple[int, ...],
    expected: BrokerPorts,
) -> None:
    assert choose_ports(previous, lambda port: port not in taken, _picker(*picks)) == expected


@given(
    st.integers(1024, 65535),
    st.integers(1024, 65535),
)
def test_listener_ports_round_trip_through_server_properties(broker: int, controller: int) -> None:
    ports = BrokerPorts(broker, controller)
    text = render_server_properties(ports, Path("/data/kafka"))
    assert parse_listener_ports(text) == ports


@pytest.mark.parametrize(
    "text",
    ["", "log.dirs=/x\n", "listeners=PLAINTEXT://127.0.0.1:9092\n", "#listeners=a\n"],
)
def test_parse_listener_ports_refuses_incomplete_properties(text: str) -> None:
    assert parse_listener_ports(text) is None


def test_server_properties_make_one_node_transactions_and_groups_work() -> None:
    text = render_server_properties(BrokerPorts(1, 2), Path("/d/kafka"))
    props = dict(line.split("=", 1) for line in text.splitlines() if not line.startswith("#"))
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ):
        assert props[key] == "1", key
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:2"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:1"
    assert int(props["log.cleaner.dedupe.buffer.size"]) <= 4 * 1024 * 1024
    assert props["log.dirs"] == "/d/kafka"


# ----------------------------------------------------------------------------- cluster id


def test_cluster_id_is_22_url_safe_chars_and_never_starts_with_dash() -> None:
    # 0xf8 << 2 encodes as "-" in url-safe base64: the first draw must be re-rolled.
    draws = iter([b"\xf8" + bytes(15), bytes(range(16))])
    cluster_id = new_cluster_id(lambda n: next(draws))
    assert cluster_id == "AAECAwQFBgcICQoLDA0ODw"


@given(st.binary(min_size=16, max_size=16))
def test_cluster_id_shape(raw: bytes) -> None:
    draws = itertools.chain([raw], itertools.repeat(bytes(16)))
    cluster_id = new_cluster_id(lambda n: next(draws))
    assert len(cluster_id) == 22
    assert not cluster_id.startswith("-")
    assert set(cluster_id) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    )


# ----------------------------------------------------------------------------- java, logs


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_351"', 8),
        ('openjdk version "25-ea" 2025-09-16', 25),
        ("something else", None),
    ],
)
def test_parse_java_major(output: str, major: int | None) -> None:
    assert parse_java_major(output) == major


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (
            "[t] INFO a (x)\n[t] ERROR Exiting Kafka (k)\njava.lang.RuntimeException: bad id\n",
            "java.lang.RuntimeException: bad id",
        ),
        ("[t] INFO a (x)\n[t] ERROR it broke (k)\n[t] INFO b (x)\n", "[t] ERROR it broke (k)"),
        ("[t] INFO a (x)\n[t] INFO last (x)\n", "[t] INFO last (x)"),
        ("", "(the log is empty)"),
    ],
)
def test_telling_line_prefers_the_exception_message(tail: str, expected: str) -> None:
    assert telling_line(tail) == expected


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            "[INFO] x\n[ERROR] Failed to execute goal: Could not resolve\n[ERROR] more\n",
            "Failed to execute goal: Could not resolve",
        ),
        ("plain failure\nlast words\n", "last words"),
        ("", "no output"),
    ],
)
def test_first_maven_error(output: str, expected: str) -> None:
    assert first_maven_error(output) == expected


# ----------------------------------------------------------------------------- jar cache


def _libs(tmp_path: Path, names: tuple[str, ...]) -> Path:
    libs = tmp_path / "libs"
    libs.mkdir()
    for name in names:
        (libs / name).write_bytes(b"")
    return libs


def test_verify_libs_accepts_the_required_set(tmp_path: Path) -> None:
    verify_libs(_libs(tmp_path, REQUIRED_JARS))


@pytest.mark.parametrize(
    ("case", "names", "complaint"),
    [
        ("missing kafka", REQUIRED_JARS[1:], f"kafka_2.13-{KAFKA_VERSION}.jar"),
        ("slf4j2 binding", (*REQUIRED_JARS, "log4j-slf4j2-impl-2.25.4.jar"), "slf4j2"),
        ("test jar", (*REQUIRED_JARS, "kafka-server-4.3.1-test.jar"), "-test.jar"),
    ],
)
def test_verify_libs_refuses(
    tmp_path: Path, case: str, names: tuple[str, ...], complaint: str
) -> None:
    with pytest.raises(JarCacheInvalidError, match=complaint.replace(".", r"\.")):
        verify_libs(_libs(tmp_path, names))


def test_pom_pins_the_versions_broker_py_expects() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.parse(runtime_file("pom.xml")).getroot()
    props = {child.tag.split("}")[1]: child.text for child in root.find("m:properties", ns) or []}
    assert props["kafka.version"] == KAFKA_VERSION
    assert f"log4j-core-{props['log4j.version']}.jar" in REQUIRED_JARS
    assert f"slf4j-api-{props['slf4j.version']}.jar" in REQUIRED_JARS
    assert root.findtext("m:packaging", namespaces=ns) == "pom"


@pytest.mark.parametrize("name", ["log4j2.properties", "tools-log4j2.properties"])
def test_log4j_configs_ship_as_package_data(name: str) -> None:
    text = runtime_file(name).read_text()
    assert "appender." in text and "rootLogger.level" in text


# ----------------------------------------------------------------------------- state, status


def _state(pid: int, data_dir: Path) -> BrokerState:
    return BrokerState(
        pid=pid,
        broker_port=1,
        controller_port=2,
        bootstrap="127.0.0.1:1",
        cluster_id="c",
        data_dir=str(data_dir),
        log_path=str(data_dir / "broker.log"),
        started_at="2026-01-01T00:00:00+00:00",
    )


def test_state_json_round_trip(tmp_path: Path) -> None:
    state = _state(123, tmp_path)
    assert BrokerState.from_json(state.to_json()) == state


def test_empty_data_dir_is_stopped(tmp_path: Path) -> None:
    status = LocalBroker(tmp_path).status()
    assert status.kind is BrokerStatusKind.STOPPED
    assert local_bootstrap(tmp_path) is None
    assert local_bootstrap(tmp_path / "does-not-exist") is None


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize(
    ("case", "pid_of"),
    [("the pid is gone", _dead_pid), ("the pid was reused by another program", os.getpid)],
)
def test_stale_state_file_is_crashed_not_running(
    tmp_path: Path, case: str, pid_of: Callable[[], int]
) -> None:
    (tmp_path / "broker.json").write_text(_state(pid_of(), tmp_path).to_json())
    status = LocalBroker(tmp_path).status()
    assert status.kind is BrokerStatusKind.CRASHED
    assert local_bootstrap(tmp_path) is None
    assert "status:     crashed" in format_status(status)


def test_stop_of_a_crashed_broker_clears_its_state(tmp_path: Path) -> None:
    (tmp_path / "broker.json").write_text(_state(_dead_pid(), tmp_path).to_json())
    result = LocalBroker(tmp_path).stop()
    assert not result.was_running
    assert LocalBroker(tmp_path).status().kind is BrokerStatusKind.STOPPED


@pytest.mark.parametrize(
    "settings",
    [
        BrokerSettings(heap_min_mb=512, heap_max_mb=256),
        BrokerSettings(heap_min_mb=32, heap_max_mb=256),
        BrokerSettings(start_timeout_s=0),
        BrokerSettings(stop_timeout_s=-1),
    ],
)
def test_configure_refuses_bad_settings(tmp_path: Path, settings: BrokerSettings) -> None:
    with pytest.raises(BrokerError):
        LocalBroker(tmp_path, settings).configure()


# ----------------------------------------------------------------------------- CLI


@pytest.mark.parametrize(
    ("argv", "teaches"),
    [
        (["broker", "--help"], ["codeclog broker start", "SIGKILL", "CODECLOG_DATA_DIR"]),
        (["broker", "start", "--help"], ["--data-dir", "--heap-max-mb", "--timeout-s"]),
        (["topics", "--help"], ["codec.progress", "cleanup.policy=compact", "--topics-config"]),
        (["topics", "create", "--help"], ["--bootstrap", "--kafka-config", "--topics-config"]),
    ],
)
def test_help_teaches(
    argv: list[str], teaches: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for phrase in teaches:
        assert phrase in out, phrase


def test_status_of_a_stopped_broker_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["broker", "status", "--data-dir", str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert "status:     stopped" in out
    assert f"log:        {tmp_path / 'broker.log'}" in out


def test_topics_without_a_cluster_is_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CODECLOG_BOOTSTRAP", raising=False)
    assert main(["topics", "list", "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "no local broker is running" in err[0]
