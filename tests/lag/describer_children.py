"""Children for tests/lag/test_describer.py (module level: a spawned child imports them)."""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any


def abort_first_then_answer(conn: Connection, config: dict[str, Any]) -> None:
    """The first child aborts on its question, as librdkafka #4605 does; later ones answer."""
    marker = Path(config["marker"])
    conn.recv()  # (group, topic)
    if not marker.exists():
        marker.write_text("aborted")
        os.abort()
    conn.send(("ok", "STABLE", 2, {0, 1}))
    conn.recv()


def never_answer(conn: Connection, config: dict[str, Any]) -> None:
    """A coordinator that never answers: note each question, answer none."""
    log = Path(config["log"])
    while True:
        question = conn.recv()
        if question is None:
            return
        with log.open("a") as f:
            f.write(f"{question}\n")
        time.sleep(0.01)
