"""The member's transactional producer settings."""

from __future__ import annotations

from typing import Any

from codeclog.kafka.log import client_settings


def transactional_producer_config(
    client_config: dict[str, str], transactional_id: str, transaction_timeout_ms: int
) -> dict[str, Any]:
    """The service's transactional producer (bench/bench_transaction.py measures the same)."""
    config = client_settings(client_config)
    config.update(
        {
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "linger.ms": 1,
            # A step's transaction begins right after the previous commit, while the
            # coordinator may still be writing its markers: it answers CONCURRENT_TRANSACTIONS
            # and librdkafka retries after retry.backoff.ms, doubling up to the max. Measured
            # on the local broker, back-to-back steps (bench_transaction.py): p50 ~110 ms with
            # the default 100, 14 ms with 10, 5 ms with 1. Other retries back off the same way.
            "retry.backoff.ms": 1,
            "retry.backoff.max.ms": 100,
            "transaction.timeout.ms": transaction_timeout_ms,
            "partitioner": "murmur2_random",
            "message.max.bytes": 4_000_000,
        }
    )
    return config
