"""Fixtures shared by every test folder.

- `kafka_bootstrap` (session): "host:port" of a real Kafka broker. Uses $CODECLOG_BOOTSTRAP when
  set; otherwise starts one LocalBroker in a fresh temp data dir, lazily (only if a test asks
  for it), fetching the jars first if needed, and stops it when the session ends. If it cannot
  start, every test using it ERRORs with the reason and the broker log tail.
- `unique_name` (function): a factory, prefix -> a topic/group name unique to this test run.
- `new_topic` (function): a factory, (prefix, partitions) -> a topic created on the broker of
  `kafka_bootstrap` with such a name, deleted when the test ends.

Tests that need the broker are marked `@pytest.mark.kafka`; skip them with `-m "not kafka"` or by
setting CODECLOG_SKIP_KAFKA=1.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from codeclog.cli.config import ENV_BOOTSTRAP
from codeclog.devtools.broker import BrokerSettings, BrokerState, LocalBroker
from codeclog.devtools.broker_errors import BrokerStartError
from codeclog.devtools.jars import JarFetcher
from codeclog.errors import CodeclogError

ENV_SKIP_KAFKA = "CODECLOG_SKIP_KAFKA"
# The long tier: tests of a minute or more each (a secured cluster through a node kill, a
# second emulated CPU, ...). `make test` (CI) runs everything; `make quick` sets CODECLOG_QUICK
# and leaves them out (each has a shorter counterpart in the quick run), listed.
ENV_QUICK = "CODECLOG_QUICK"
# Opt-in for machines with a Docker engine but no Java/Maven: the broker comes from
# testcontainers (pip install 'codeclog[containers]'). Off here: this CI has no Docker engine.
ENV_TESTCONTAINERS = "CODECLOG_TESTCONTAINERS"
CONTAINER_IMAGE = "confluentinc/cp-kafka:7.6.0"  # testcontainers' documented KRaft-capable image
# Below pytest-timeout's 300 s so a stuck Maven fails this fixture, not the whole run.
TEST_FETCH_TIMEOUT_S = 240.0
# A cold JVM needs about 5 s on an idle 2-core box, but several times that when other test
# sessions share the cores.
TEST_START_TIMEOUT_S = 120.0
# The real-package tier runs in the vllm-omni environment, through tests/omni/test_vllm_omni_tier.py
collect_ignore = ["vllm_omni_tier"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(ENV_QUICK):
        long = [item for item in items if "long" in item.keywords]
        if long:
            items[:] = [item for item in items if "long" not in item.keywords]
            config.hook.pytest_deselected(items=long)
            names = ", ".join(item.nodeid.rsplit("::", 1)[-1] for item in long)
            print(f"\nlong tier left out ({ENV_QUICK} is set; `make test` runs it): {names}")
    if not os.environ.get(ENV_SKIP_KAFKA):
        return
    skip = pytest.mark.skip(reason=f"{ENV_SKIP_KAFKA} is set")
    for item in items:
        if "kafka" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def kafka_bootstrap(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    external = os.environ.get(ENV_BOOTSTRAP)
    if external:
        yield external
        return
    if os.environ.get(ENV_TESTCONTAINERS):
        yield from _container_broker()
        return
    settings = BrokerSettings(
        die_with_parent=True,  # a killed test session must not leave a JVM behind
        start_timeout_s=TEST_START_TIMEOUT_S,
        # C1-only JIT: about 40% less CPU to start (measured), which matters when test sessions
        # share 2 cores; tests are functional, never throughput benchmarks of the broker.
        extra_jvm_args=("-XX:TieredStopAtLevel=1",),
        fetcher=JarFetcher(timeout_s=TEST_FETCH_TIMEOUT_S),
    )
    broker = LocalBroker(tmp_path_factory.mktemp("kafka-broker"), settings)
    state = _start_or_fail(broker, _terminal_progress(request))
    try:
        yield state.bootstrap
    finally:
        broker.stop()


def _container_broker() -> Iterator[str]:
    """A KRaft broker in a container (testcontainers' KafkaContainer), for Docker users."""
    pytest.importorskip("testcontainers", reason="pip install 'codeclog[containers]'")
    from testcontainers.community.kafka import KafkaContainer

    container = KafkaContainer(image=CONTAINER_IMAGE).with_kraft()
    container.start()
    try:
        yield container.get_bootstrap_server()
    finally:
        container.stop()


def _start_or_fail(broker: LocalBroker, progress: Callable[[str], None]) -> BrokerState:
    try:
        return broker.start(progress)
    except BrokerStartError as exc:
        tail = exc.log_tail
        message = str(exc)
    except CodeclogError as exc:
        tail = broker.log_tail()
        message = str(exc)
    # pytest caches a session fixture's failure: every kafka test errors with this at once.
    log = f"\n--- tail of {broker.log_path} ---\n{tail}" if tail else ""
    pytest.fail(f"the test Kafka broker did not start: {message}{log}", pytrace=False)


def _terminal_progress(request: pytest.FixtureRequest) -> Callable[[str], None]:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")

    def progress(message: str) -> None:
        if reporter is not None:
            reporter.write_line(f"[kafka_bootstrap] {message}")

    return progress


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """prefix -> "<prefix>-<test name>-<random>", legal as a Kafka topic and group name."""
    test = _kafka_safe(request.node.name)[:60]

    def make(prefix: str) -> str:
        return f"{_kafka_safe(prefix)}-{test}-{uuid.uuid4().hex[:12]}"

    return make


@pytest.fixture
def new_topic(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> Iterator[Callable[..., str]]:
    """(prefix, partitions=1) -> the name of a new topic (replication 1), deleted at the end."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    created: list[str] = []

    def make(prefix: str, partitions: int = 1) -> str:
        name = unique_name(prefix)
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
        created.append(name)
        return name

    yield make
    if created:
        admin.delete_topics(created)


def _kafka_safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "x"
