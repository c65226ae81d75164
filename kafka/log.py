"""librdkafka's own log lines go to one Python logger, `codeclog.kafka`, in every Kafka client
codeclog builds, never straight to stderr. Reasons: docs/operating.md, "Liveness bounds"."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

KAFKA_LOG = logging.getLogger("codeclog.kafka")
KAFKA_LOG.addHandler(logging.NullHandler())


def client_settings(*configs: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka properties for a new client: `configs` merged in order (the later wins), its
    log lines to KAFKA_LOG unless one of them names its own `logger`."""
    settings: dict[str, Any] = {}
    for config in configs:
        settings.update(config)
    settings.setdefault("logger", KAFKA_LOG)
    return settings
