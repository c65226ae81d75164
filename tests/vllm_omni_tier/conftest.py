"""The real-package tier's fixtures: the broker the outer session started, a topic per test,
and vLLM's own plugin loading (which registers codeclog's connector in this process)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

PARTITIONS = 4


@pytest.fixture(scope="session")
def bootstrap() -> str:
    address = os.environ.get("CODECLOG_BOOTSTRAP")
    if not address:
        pytest.fail(
            "CODECLOG_BOOTSTRAP is not set: run this tier through tests/omni/test_vllm_omni_tier.py"
        )
    return address


@pytest.fixture(scope="session", autouse=True)
def plugins() -> None:
    from vllm.plugins import load_general_plugins

    load_general_plugins()


@pytest.fixture
def new_topic(bootstrap: str) -> Iterator[Callable[[], str]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created: list[str] = []

    def make() -> str:
        name = f"omni-tier-{uuid.uuid4().hex[:12]}"
        admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
        created.append(name)
        return name

    yield make
    if created:
        admin.delete_topics(created)
