"""The one commit in flight: a step's transaction is committed on a helper thread while the
member polls and decodes the next batch; a commit still running past its bound is abandoned as
stuck (whatever it does later no longer counts), and a failure is kept until it is taken."""

from __future__ import annotations

import threading
from collections.abc import Callable

from confluent_kafka import KafkaException

from codeclog.consumers.member.boundary import TransactionError
from codeclog.kafka.calls import StuckCallError


class BackgroundCommit:
    """At most one commit thread, and the failure of the last commit that counted."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None  # the previous step's commit
        self._error: TransactionError | None = None
        self._generation = 0  # bumped when a stuck commit is abandoned

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, commit: Callable[[], None], on_committed: Callable[[], None]) -> None:
        """Run `commit` on a helper thread; `on_committed` runs there after a commit that still
        counts (not abandoned as stuck meanwhile)."""
        self._thread = threading.Thread(
            target=self._run, args=(commit, on_committed), name="codeclog-commit", daemon=True
        )
        self._thread.start()

    def _run(self, commit: Callable[[], None], on_committed: Callable[[], None]) -> None:
        generation = self._generation
        try:
            commit()
        except KafkaException as exc:
            if generation == self._generation:
                self._error = exc
            return
        if generation == self._generation:  # else abandoned as stuck: it no longer counts
            on_committed()

    def join(self, limit_s: float) -> None:
        """Wait for the commit in flight without raising; one still running after `limit_s`
        is stuck: abandoned, recorded as the failure."""
        if self._thread is not None:
            self._thread.join(limit_s)
            if self._thread.is_alive():
                self._generation += 1  # whatever it does later no longer counts
                self._error = StuckCallError("commit_transaction", limit_s)
            self._thread = None

    def take_error(self) -> TransactionError | None:
        """The recorded failure, once."""
        error, self._error = self._error, None
        return error
