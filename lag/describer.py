"""A consumer group's state, members and owned partitions, asked in a child process.
Reasons: docs/lag.md, "The exporter's abort when the group coordinator dies"."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger("codeclog.lag")

# the request's own timeout: past librdkafka's socket.timeout.ms (60 s), so a coordinator
# request that hangs is failed by its broker timeout first
DESCRIBE_REQUEST_TIMEOUT_S = 120.0
STOP_WAIT_S = 2.0

Answer = tuple[Any, ...]  # ("ok", state, members, owned) | ("error", code, reason)
Description = tuple[str | None, int | None, set[int] | None]
UNKNOWN: Description = (None, None, None)


def serve(conn: Connection, client_config: dict[str, Any]) -> None:
    """The child: answer (group, topic) questions until None or the pipe closes."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(client_config)
    while True:
        try:
            question = conn.recv()
        except (EOFError, OSError):
            return
        if question is None:
            return
        group, topic = question
        future = admin.describe_consumer_groups(
            [group], request_timeout=DESCRIBE_REQUEST_TIMEOUT_S
        )[group]
        try:
            description = future.result()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            code = error.code() if isinstance(error, KafkaError) else KafkaError.UNKNOWN
            conn.send(("error", code, str(error)))
            continue
        owned = {
            tp.partition
            for member in description.members
            for tp in member.assignment.topic_partitions
            if tp.topic == topic
        }
        state = description.state
        name = getattr(state, "name", None) if state is not None else None
        conn.send(("ok", name if name is not None else state, len(description.members), owned))


class GroupDescriber:
    """Asks a child process to describe groups; `ask` waits at most `timeout_s`."""

    def __init__(
        self,
        client_config: Mapping[str, str],
        timeout_s: float,
        target: Callable[[Connection, dict[str, Any]], None] = serve,
    ) -> None:
        self._config = dict(client_config)
        self._timeout_s = timeout_s
        self._target = target
        self._process: Any = None
        self._conn: Connection | None = None
        self._asked: tuple[str, str] | None = None  # the question the child is answering
        self.deaths = 0

    def ask(self, group: str, topic: str) -> Answer | None:
        """The child's answer about `group`, or None when it is unknown now (the child is
        still waiting on a coordinator, is answering another question, or died)."""
        conn = self._connection()
        try:
            if self._asked is None:
                conn.send((group, topic))
                self._asked = (group, topic)
            if not conn.poll(self._timeout_s):
                return None
            answer: Answer = conn.recv()
        except (EOFError, OSError):
            self._died()
            return None
        asked, self._asked = self._asked, None
        return answer if asked == (group, topic) else None

    def close(self) -> None:
        conn, process = self._conn, self._process
        self._conn, self._process, self._asked = None, None, None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(None)
            conn.close()
        if process is not None:
            process.join(STOP_WAIT_S)
            if process.is_alive():
                process.kill()
                process.join(STOP_WAIT_S)

    def _connection(self) -> Connection:
        if self._conn is None:
            context = multiprocessing.get_context("spawn")
            parent, child = context.Pipe()
            process = context.Process(
                target=self._target,
                args=(child, self._config),
                name="codeclog-describe",
                daemon=True,
            )
            process.start()
            child.close()
            self._conn, self._process = parent, process
        return self._conn

    def _died(self) -> None:
        """The child is gone (librdkafka aborted it): unknown now, a new child next time."""
        process = self._process
        self._conn, self._process, self._asked = None, None, None
        code = None
        if process is not None:
            process.join(STOP_WAIT_S)
            code = process.exitcode
        self.deaths += 1
        log.warning(
            "the group describer process died (exit %s, librdkafka #4605): group state unknown "
            "for this measurement; a new one is started",
            code,
        )
