"""librdkafka's own log lines reach the `codeclog.kafka` logger from every library client, never
file descriptor 2 (codeclog.kafka.log). No broker: each client is pointed at a closed port, so
librdkafka logs a failed connect (`%3|...|FAIL|...` when it writes to stderr itself)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from codeclog.kafka.log import KAFKA_LOG, client_settings

ROOT = Path(__file__).resolve().parents[1]
NOWHERE = "127.0.0.1:1"  # nothing listens: every connect is refused at once
RAW_LINE = re.compile(r"^%\d\|", re.MULTILINE)  # librdkafka's own stderr format


def _listener() -> None:
    from codeclog.consumers.readers.listener import AudioListener, StartMode

    config = {"bootstrap.servers": NOWHERE}
    listener = AudioListener(config, "codec.audio", start=StartMode.BEGINNING, partitions=[0])
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert listener.poll(0.1) == []
    listener.close()


def _publisher() -> None:
    from codeclog.producers.publisher import ChunkPublisher

    publisher = ChunkPublisher({"bootstrap.servers": NOWHERE})
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        publisher.poll(0.1)


def _connector() -> None:
    from codeclog.omni.connector import CodeclogKafkaConnector

    connector = CodeclogKafkaConnector({"bootstrap": NOWHERE, "delivery_timeout_ms": 1000})
    try:
        assert connector.put("talker", "code2wav", "r-1_0_0", {"x": 1})[0] is False
    finally:
        connector.close()


def _verify_metadata() -> None:
    from codeclog.consumers.readers.verify import partitions_of
    from codeclog.errors import CodeclogError

    with pytest.raises(CodeclogError, match=f"no answer from the cluster at {NOWHERE}"):
        partitions_of({"bootstrap.servers": NOWHERE}, "codec.audio", timeout_s=1.0)


@pytest.mark.parametrize(
    "client",
    [_listener, _publisher, _connector, _verify_metadata],
    ids=["listener", "publisher", "omni_connector", "verify_metadata"],
)
def test_librdkafka_lines_reach_the_logger_not_stderr(
    client: Callable[[], None], capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=KAFKA_LOG.name)
    client()
    err = capfd.readouterr().err
    assert not RAW_LINE.search(err), err
    if client is not _verify_metadata:  # an AdminClient serves its log queue only in poll()
        lines = [r.getMessage() for r in caplog.records if r.name == KAFKA_LOG.name]
        assert any("Connection refused" in line for line in lines), lines


def test_a_library_process_without_logging_setup_prints_no_librdkafka_line() -> None:
    """As a library should: the `codeclog.kafka` logger has a NullHandler, so Python's
    last-resort handler does not print the lines either (a vLLM process decides)."""
    code = (
        "import time\n"
        "from codeclog.producers.publisher import ChunkPublisher\n"
        f"p = ChunkPublisher({{'bootstrap.servers': '{NOWHERE}'}})\n"
        "end = time.monotonic() + 1.5\n"
        "while time.monotonic() < end:\n"
        "    p.poll(0.1)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "rdkafka" not in result.stderr and "Connect to" not in result.stderr, result.stderr


def test_client_settings_merge_in_order_and_keep_a_callers_logger() -> None:
    own = logging.getLogger("somebody.else")
    settings = client_settings({"a": "1", "b": "1"}, {"b": "2"})
    assert settings == {"a": "1", "b": "2", "logger": KAFKA_LOG}
    assert client_settings({"logger": own}, {"c": "3"})["logger"] is own
