"""The real local broker: start, produce/consume, stop, restart, transactions, clear errors.

Tests marked `kafka` run JVMs: the session broker (`kafka_bootstrap`) or their own LocalBroker
in a temp dir. The java/Maven error tests need no broker.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from codeclog.cli import main
from codeclog.devtools.broker import BrokerSettings, BrokerStatusKind, LocalBroker
from codeclog.devtools.broker_errors import BrokerStartError, JavaNotFoundError, JavaTooOldError
from codeclog.devtools.cluster import local_bootstrap
from codeclog.devtools.host import pick_free_port, port_is_free
from codeclog.devtools.jars import JarFetcher, JarFetchError, MavenNotFoundError

READ_TIMEOUT_S = 30.0
END = b"end"  # the last record of every test topic, so readers know when they have it all


def _own_broker(data_dir: Path) -> LocalBroker:
    settings = BrokerSettings(
        heap_max_mb=512,
        start_timeout_s=120,
        die_with_parent=True,
        extra_jvm_args=("-XX:TieredStopAtLevel=1",),  # as the session broker: cheaper start
    )
    return LocalBroker(data_dir, settings)


def _create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=30)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value=value, key=b"k")
    assert producer.flush(30) == 0


def _read(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[bytes]:
    """The values of partition 0 before its END record (the test fails if END never comes)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{topic}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + READ_TIMEOUT_S
    while values[-1:] != [END] and time.monotonic() < deadline:
        values += _poll_values(consumer, 1, timeout_s=0.2)
    consumer.close()
    assert values[-1:] == [END], f"no END record in {topic} after {READ_TIMEOUT_S} s: {values}"
    return values[:-1]


def _poll_values(consumer: Consumer, count: int, timeout_s: float = READ_TIMEOUT_S) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(values) < count and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            values.append(message.value() or b"")
    return values


@contextlib.contextmanager
def _occupied(*ports: int) -> Iterator[None]:
    """Hold listening sockets on the ports, as another program would."""
    with contextlib.ExitStack() as stack:
        for port in ports:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen()
        yield


# ----------------------------------------------------------------------------- lifecycle


@pytest.mark.kafka
def test_restart_keeps_the_data_even_when_the_old_ports_are_taken(
    tmp_path: Path, unique_name: Callable[[str], str]
) -> None:
    broker = _own_broker(tmp_path / "kb")
    topic = unique_name("restart")
    try:
        first = broker.start()
        assert local_bootstrap(broker.data_dir) == first.bootstrap
        assert LocalBroker(broker.data_dir).start() == first  # idempotent, from any object
        _produce(first.bootstrap, topic, [b"a", b"b", b"c", END])
        assert _read(first.bootstrap, topic) == [b"a", b"b", b"c"]

        stopped = broker.stop()
        assert stopped.was_running and not stopped.forced
        assert stopped.exit_code in (0, 143)  # 143: the JVM's exit after SIGTERM
        assert broker.status().kind is BrokerStatusKind.STOPPED
        assert local_bootstrap(broker.data_dir) is None

        with _occupied(first.broker_port, first.controller_port):
            second = broker.start()
        assert {second.broker_port, second.controller_port}.isdisjoint(
            {first.broker_port, first.controller_port}
        )
        assert second.cluster_id == first.cluster_id
        assert _read(second.bootstrap, topic) == [b"a", b"b", b"c"]
    finally:
        broker.stop()
    assert not broker.stop().was_running


@pytest.mark.kafka
@pytest.mark.slow
def test_a_port_lost_to_a_race_is_retried_with_new_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another program binds the port between our probe and the JVM's bind: the JVM exits with
    # "Address already in use" and start() must pick new ports instead of failing.
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "server.properties").write_text(
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{pick_free_port()}\n"
    )
    probes: list[int] = []

    def probe_lies_once(candidate: int) -> bool:
        probes.append(candidate)
        return len(probes) <= 2 or port_is_free(candidate)

    monkeypatch.setattr("codeclog.devtools.broker.port_is_free", probe_lies_once)
    broker = _own_broker(tmp_path / "kb")
    try:
        state = broker.start()
        assert state.broker_port != port
        assert "Address already in use" in broker.log_path.read_text()
    finally:
        broker.stop()
        taken.close()


@pytest.mark.kafka
def test_two_brokers_with_different_data_dirs_run_at_once(
    kafka_bootstrap: str, tmp_path: Path, unique_name: Callable[[str], str]
) -> None:
    other = _own_broker(tmp_path / "other")
    topic = unique_name("two")
    try:
        state = other.start()
        assert state.bootstrap != kafka_bootstrap
        _produce(state.bootstrap, topic, [b"only-on-other", END])
        _produce(kafka_bootstrap, topic, [b"only-on-session", END])
        assert _read(state.bootstrap, topic) == [b"only-on-other"]
        assert _read(kafka_bootstrap, topic) == [b"only-on-session"]
        ids = {
            AdminClient({"bootstrap.servers": bs}).list_topics(timeout=10).cluster_id
            for bs in (state.bootstrap, kafka_bootstrap)
        }
        assert len(ids) == 2
    finally:
        other.stop()


@pytest.mark.kafka
def test_a_failed_start_reports_the_cause_from_the_broker_log(tmp_path: Path) -> None:
    # A data dir formatted for another node id: Kafka refuses it at start-up.
    broker = _own_broker(tmp_path / "kb")
    broker.log_dirs.mkdir(parents=True)
    (broker.log_dirs / "meta.properties").write_text(
        "version=1\nnode.id=7\ncluster.id=AAAAAAAAAAAAAAAAAAAAAA\n"
        "directory.id=AAAAAAAAAAAAAAAAAAAAAA\n"
    )
    with pytest.raises(BrokerStartError) as error:
        broker.start()
    assert "node id 7" in str(error.value)
    assert "Exiting Kafka" in error.value.log_tail
    assert broker.status().kind is BrokerStatusKind.STOPPED


# ----------------------------------------------------------------------------- transactions


def _consume_inputs(bootstrap: str, topic: str, group: str, count: int) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    assert _poll_values(consumer, count) == [b"in-%d" % i for i in range(count)]
    return consumer


@pytest.mark.kafka
def test_transaction_commits_outputs_and_group_offsets_together(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    source, sink, group = unique_name("txn-in"), unique_name("txn-out"), unique_name("txn-g")
    _create_topic(kafka_bootstrap, source)
    _create_topic(kafka_bootstrap, sink)
    _produce(kafka_bootstrap, source, [b"in-0", b"in-1", b"in-2"])
    consumer = _consume_inputs(kafka_bootstrap, source, group, 3)

    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": group})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(sink, value=b"out-%d" % i)
    producer.send_offsets_to_transaction(
        consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
    )
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(sink, value=b"aborted")
    producer.flush(30)
    producer.abort_transaction(30)
    consumer.close()
    _produce(kafka_bootstrap, sink, [END])  # lands after the abort marker

    assert _read(kafka_bootstrap, sink) == [b"out-0", b"out-1", b"out-2"]
    uncommitted = _read(kafka_bootstrap, sink, isolation="read_uncommitted")
    assert uncommitted == [b"out-0", b"out-1", b"out-2", b"aborted"]
    # The group resumes after the offsets committed inside the transaction.
    _produce(kafka_bootstrap, source, [b"in-3"])
    resumed = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    resumed.subscribe([source])
    assert _poll_values(resumed, 1) == [b"in-3"]
    resumed.close()


@pytest.mark.kafka
def test_a_second_producer_with_the_same_transactional_id_fences_the_first(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    # librdkafka's mock cluster does not enforce this; the real broker must.
    topic, txn_id = unique_name("fence"), unique_name("fence-txn")
    _create_topic(kafka_bootstrap, topic)
    config = {"bootstrap.servers": kafka_bootstrap, "transactional.id": txn_id}
    zombie = Producer(config)
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie")
    zombie.flush(30)
    Producer(config).init_transactions(30)
    with pytest.raises(KafkaException) as error:
        zombie.commit_transaction(30)
    assert error.value.args[0].fatal()


# ----------------------------------------------------------------------------- clear errors


def _fake_java(directory: Path, version_line: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    java = directory / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    return java


@pytest.fixture
def bare_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH holds one empty dir: no java, no mvn; no JAVA_HOME or CODECLOG_JAVA either."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.delenv("CODECLOG_JAVA", raising=False)
    return empty


def test_missing_java_on_path_is_one_clear_error(tmp_path: Path, bare_path: Path) -> None:
    with pytest.raises(JavaNotFoundError, match=r"Java 17\+ is needed .* PATH's `java`"):
        LocalBroker(tmp_path / "kb").start()


def test_missing_configured_java_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "jdk" / "bin" / "java"
    with pytest.raises(JavaNotFoundError, match=re.escape(str(missing))):
        LocalBroker(tmp_path / "kb", BrokerSettings(java=str(missing))).start()


def test_java_home_without_java_names_java_home(
    tmp_path: Path, bare_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nojdk"))
    with pytest.raises(JavaNotFoundError, match=r"\$JAVA_HOME"):
        LocalBroker(tmp_path / "kb").start()


def test_java_8_is_refused(tmp_path: Path) -> None:
    java = _fake_java(tmp_path / "jdk8", 'java version "1.8.0_351"')
    with pytest.raises(JavaTooOldError, match="Java 8"):
        LocalBroker(tmp_path / "kb", BrokerSettings(java=str(java))).start()


def test_cli_start_without_java_prints_one_sentence(
    tmp_path: Path, bare_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["broker", "start", "--data-dir", str(tmp_path / "kb")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("codeclog broker start: Java 17+ is needed")


def test_missing_maven_is_one_clear_error(tmp_path: Path, bare_path: Path) -> None:
    java = _fake_java(tmp_path / "jdk", 'openjdk version "17.0.15" 2025-04-15')
    fetcher = JarFetcher(libs_dir=tmp_path / "libs")
    settings = BrokerSettings(java=str(java), fetcher=fetcher)
    with pytest.raises(MavenNotFoundError, match=r"Maven .* not found"):
        LocalBroker(tmp_path / "kb", settings).start()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mvn") is None, reason="needs mvn")
def test_maven_without_network_is_one_clear_error_and_leaves_no_half_fetch(
    tmp_path: Path,
) -> None:
    # Offline with an empty local repository is what "no Maven Central" looks like.
    libs = tmp_path / "cache" / "libs"
    offline = ("-o", f"-Dmaven.repo.local={tmp_path / 'm2'}")
    with pytest.raises(JarFetchError, match="is Maven Central reachable"):
        JarFetcher(libs_dir=libs, maven_args=offline).ensure()
    assert not libs.exists()
    assert list(libs.parent.iterdir()) == []  # the staging dir is gone too
