"""What the member learns from the cluster once, at start (`cluster_facts`).
Reasons: docs/operating.md, "Liveness bounds"."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from confluent_kafka import KafkaException

from codeclog.consumers.stream.dead_letter import DEAD_LETTER_HEADROOM_BYTES, DEAD_LETTER_RAW_LIMIT
from codeclog.kafka.calls import (
    InfrastructureError,
    StuckCallError,
    bounded,
    one_line,
)
from codeclog.kafka.log import client_settings
from codeclog.topics_config import TopicsConfig

log = logging.getLogger("codeclog.vocode")


@dataclasses.dataclass(frozen=True)
class ClusterFacts:
    """What the member reads from the cluster before it joins the group."""

    chunk_partitions: int | None  # None: the chunk topic does not exist (yet)
    dead_letter_raw_limit: int  # raw bytes a dead letter keeps whole
    live_exists: bool = True  # the live topic exists (else the member writes no live copies)


def cluster_facts(
    client_config: dict[str, str], topics: TopicsConfig, timeout_s: float
) -> ClusterFacts:
    """InfrastructureError (exit 1) when the cluster does not answer within `timeout_s`. One
    metadata request first, so an unreachable cluster is one error, not a minute of librdkafka
    retries; it also says how many partitions the chunk topic has (the open-stream limit is a
    count per partition, consumers/stream/limit.py), how large a dead letter may be (the
    dead-letter topic's max.message.bytes) and whether the live topic exists."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(client_settings(client_config))
    try:
        metadata = bounded("list_topics", lambda: admin.list_topics(timeout=timeout_s), timeout_s)
    except (KafkaException, StuckCallError) as exc:
        raise InfrastructureError(
            f"no answer from the cluster at {client_config.get('bootstrap.servers', '?')} "
            f"within {timeout_s:g} s ({one_line(exc)})"
        ) from exc
    chunks = metadata.topics.get(topics.chunks)
    if chunks is None:
        log.warning("topic %s does not exist (yet)", topics.chunks)
    partitions = len(chunks.partitions) if chunks is not None and chunks.partitions else None
    live = metadata.topics.get(topics.live)
    live_exists = live is not None and live.error is None
    return ClusterFacts(partitions, _dead_letter_limit(admin, topics.dlq, timeout_s), live_exists)


def _dead_letter_limit(admin: Any, topic: str, timeout_s: float) -> int:
    """Dead letters must fit the dead-letter topic: keep whole at most its max.message.bytes
    minus headroom (unknown, e.g. the topic does not exist yet: the default limit)."""
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        futures = admin.describe_configs([resource], request_timeout=timeout_s)
        entries = bounded(
            "describe_configs", lambda: futures[resource].result(timeout_s), timeout_s
        )
        topic_max = int(entries["max.message.bytes"].value)
    except Exception as exc:  # the topic may not exist yet: keep the default
        log.debug("max.message.bytes of %s unknown: %s", topic, exc)
        return DEAD_LETTER_RAW_LIMIT
    limit = min(DEAD_LETTER_RAW_LIMIT, max(0, topic_max - DEAD_LETTER_HEADROOM_BYTES))
    if limit != DEAD_LETTER_RAW_LIMIT:
        log.info("dead letters keep raw values whole up to %d bytes (%s)", limit, topic)
    return limit
