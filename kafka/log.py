"""librdkafka's own log lines (failed connects, session timeouts, ...) go to one Python logger,
`codeclog.kafka`, in every Kafka client codeclog builds, never straight to stderr.

Without a `logger` property librdkafka writes `%3|1700000000.000|FAIL|...` lines to file
descriptor 2 itself, past Python's logging: a command's one-line error drowned in hundreds of
them, and an embedding process (vLLM) could neither filter nor redirect them. `client_settings`
is the one place that sets the property; the logger carries a NullHandler, so the lines show
only where the application configured logging (`codeclog vocode -v` does), as a library should.
"""

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
