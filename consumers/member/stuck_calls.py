"""The calls stuck inside librdkafka, and the producers given up on with them.
Reasons: docs/operating.md, "Liveness bounds"."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException, Producer

from codeclog.kafka.calls import InfrastructureError, StuckCallError, bounded

log = logging.getLogger("codeclog.vocode")


class StuckCalls:
    """The calls stuck inside the current producer, and the producers given up on with theirs."""

    def __init__(self, limit: int, close_bound_s: float) -> None:
        self.limit = limit  # producers given up on with a call still inside, at most
        self._close_bound_s = close_bound_s
        self._abandoned: list[tuple[Producer, tuple[threading.Thread, ...]]] = []
        self._stuck: list[threading.Thread] = []  # calls stuck inside the current producer

    @property
    def abandoned(self) -> int:
        """Producers given up on and not destroyed yet (a call is still inside, or not reaped
        yet)."""
        return len(self._abandoned)

    def bounded(self, what: str, call: Callable[[], Any], timeout_s: float) -> Any:
        """kafka.calls.bounded on the current producer; a call that gets stuck is noted as
        inside it (it is destroyed only after that call returned)."""
        try:
            return bounded(what, call, timeout_s)
        except StuckCallError as exc:
            if exc.worker is not None:
                self._stuck.append(exc.worker)
            raise

    def give_up(self, producer: Producer) -> None:
        """`producer` is replaced: abandoned with the calls stuck inside it."""
        self._abandoned.append((producer, tuple(self._stuck)))
        self._stuck = []

    def replaced(self) -> None:
        """A new producer replaces the current one: no call is inside it yet."""
        self._stuck = []

    def reap(self) -> None:
        """Destroy, in the background, every abandoned producer no call is inside any more."""
        left = []
        for producer, calls in self._abandoned:
            if any(call.is_alive() for call in calls):
                left.append((producer, calls))
            else:
                close_retired(producer, self._close_bound_s)
        self._abandoned = left

    def too_many(self) -> InfrastructureError | None:
        """The error that ends the member once more than `limit` producers given up on still
        have a call inside: their handles are released only with the process."""
        if len(self._abandoned) <= self.limit:
            return None
        calls = sorted({c.name for _, stuck in self._abandoned for c in stuck})
        return InfrastructureError(
            f"{len(self._abandoned)} transactional producers given up on still have a call "
            f"stuck inside librdkafka ({', '.join(calls)}; librdkafka #5456); ending so "
            "that a restart releases their threads and sockets"
        )


def close_retired(producer: Producer, bound: float) -> None:
    """A producer replaced with no call inside it (after an indefinite outcome, a fatal error,
    or once its stuck call returned): purged, flushed and closed on a daemon thread, so its
    threads and sockets do not pile up. Closed, not only dropped: a reference left anywhere (an
    exception's traceback kept by a log record, a cycle the collector has not reached) would
    keep the handle alive (the hour-long soak: one more handle, +13 fds, after each such fault)."""

    def close() -> None:
        try:
            producer.purge()
            producer.flush(bound)
        except (KafkaException, RuntimeError) as exc:
            log.debug("closing a retired producer: %s", exc)
        try:
            producer.close()  # destroys the handle whoever still references the object
        except (KafkaException, RuntimeError) as exc:
            log.debug("closing a retired producer: %s", exc)

    threading.Thread(target=close, name="codeclog-retire", daemon=True).start()
