"""One secured broker per test session (`--security scram`), and per-test topics with the role
ACLs on it.

- `secure_broker` (session): a LocalBroker started with SASL_SSL + SCRAM-SHA-512 + the
  StandardAuthorizer in a fresh temp data dir; its role properties files.
- `secure_stack` (function): fresh topics and a fresh group on it, created by the super user,
  with `codeclog.kafka.acls.role_acls` applied for them; helpers to run CLI commands as a role.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from codeclog.cli.config import read_properties
from codeclog.devtools.broker import BrokerSettings, BrokerState, LocalBroker
from codeclog.devtools.jars import JarFetcher
from codeclog.kafka.acls import apply_acls, role_acls
from codeclog.kafka.topics import ensure_topics
from tests.consumer.conftest import Stack, tiny_engine, topics_file
from tests.topics import fresh_topics

__all__ = ["tiny_engine"]  # the session vocoder fixture, shared with tests/consumer

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("admin", "talker", "vocoder", "monitor", "replay")


@dataclasses.dataclass(frozen=True)
class SecureBroker:
    state: BrokerState
    role_files: dict[str, Path]

    def config(self, role: str) -> dict[str, str]:
        return read_properties(self.role_files[role])


@pytest.fixture(scope="session")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    settings = BrokerSettings(
        security="scram",
        die_with_parent=True,
        start_timeout_s=120.0,
        extra_jvm_args=("-XX:TieredStopAtLevel=1",),
        fetcher=JarFetcher(timeout_s=240.0),
    )
    broker = LocalBroker(tmp_path_factory.mktemp("secure-broker"), settings)
    try:
        state = broker.start()
    except Exception as exc:  # one clear failure for every secured test
        pytest.fail(f"the secured broker did not start: {exc}\n{broker.log_tail()}", pytrace=False)
    files = {role: Path(path) for role, path in state.role_configs.items()}
    try:
        yield SecureBroker(state, files)
    finally:
        broker.stop()


@dataclasses.dataclass
class SecureStack(Stack):
    """A Stack on the secured broker: `as_role` picks whose properties `client` returns (the
    helpers publish_sessions, publish_raw use it); `run` runs a CLI command as a role."""

    secure: SecureBroker | None = None
    as_role: str = "talker"

    @property
    def client(self) -> dict[str, str]:
        assert self.secure is not None
        return self.secure.config(self.as_role)

    def role_file(self, role: str) -> Path:
        assert self.secure is not None
        return self.secure.role_files[role]

    def run(
        self, role: str | Path | None, *args: str, timeout_s: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """`codeclog ARGS --kafka-config <role's file> --topics-config <this stack's>`."""
        config: list[str] = []
        if role is not None:
            path = role if isinstance(role, Path) else self.role_file(role)
            config = ["--kafka-config", str(path)]
        # This stack's topics first: a later --topics-config in `args` wins (argparse).
        command = [sys.executable, "-m", "codeclog.cli", args[0], *config]
        command += ["--topics-config", str(self.topics_file), *args[1:]]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        return subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env
        )


def _wait_acls_visible(admin: dict[str, str], expected: int, timeout_s: float = 30.0) -> None:
    """CreateAcls returns once the controller committed them; the broker's authorizer applies
    them when it replays the metadata log. Wait until DescribeAcls (answered by that
    authorizer) lists at least `expected` bindings."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    client = AdminClient(admin)
    match_all = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
        AclOperation.ANY, AclPermissionType.ANY,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(client.describe_acls(match_all).result(10)) >= expected:
            return
        time.sleep(0.2)
    raise AssertionError(f"fewer than {expected} ACLs visible after {timeout_s} s")


@pytest.fixture
def secure_stack(
    secure_broker: SecureBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> Iterator[SecureStack]:
    topics = fresh_topics(unique_name)
    group = unique_name("group")
    admin = secure_broker.config("admin")
    ensure_topics(admin, topics)
    specs = role_acls(topics, group=group)
    apply_acls(admin, specs)
    _wait_acls_visible(admin, len(specs))
    stack = SecureStack(
        secure_broker.state.bootstrap,
        topics,
        topics_file(topics, tmp_path),
        group,
        tmp_path,
        secure=secure_broker,
    )
    yield stack
    stack.kill_processes()
