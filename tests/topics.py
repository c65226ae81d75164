"""Topic names of one test, for the tests that make their own topics on the shared broker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from codeclog.topics_config import TopicsConfig


def fresh_topics(
    unique_name: Callable[[str], str], partitions: int = 4, prefix: str = "", **extra: Any
) -> TopicsConfig:
    """One test's own topic names (`unique_name` of `prefix` + the topic's kind), 4 partitions
    unless told; `extra` sets the rest of the TopicsConfig."""
    names = {kind: unique_name(prefix + kind) for kind in ("chunks", "audio", "dlq", "progress")}
    return TopicsConfig(**names, partitions=partitions, **extra)
