"""The transactions in flight: steps queue, and one helper thread writes them, all that queued
meanwhile in one transaction. Reasons: docs/operating.md, "A step and its transaction"."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from codeclog.consumers.member.step_writes import StepWrites

Queued = tuple[StepWrites, Callable[[], None]]  # a step and what runs once it committed
# writes one transaction of the steps and commits it (Transactions._write_transaction)
WriteTransaction = Callable[[Sequence[StepWrites]], None]


class TransactionWriter:
    """The queue of steps waiting for their transaction, and the one thread writing them. Each
    call the thread makes is bounded (kafka.calls.bounded), so it always returns."""

    def __init__(self, write: WriteTransaction, max_queued_bytes: int) -> None:
        self._write = write
        self.max_queued_bytes = max_queued_bytes
        self._cond = threading.Condition()
        self._queue: list[Queued] = []
        self._queued_bytes = 0
        self._thread: threading.Thread | None = None
        self._error: Exception | None = None  # a TransactionError, unless a bug
        self.transactions = 0  # committed by this writer
        self.most_steps = 0  # the most steps one transaction carried

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._thread is not None or bool(self._queue)

    def submit(self, step: StepWrites, on_committed: Callable[[], None]) -> None:
        """Queue `step`; raise the failure of an earlier transaction instead (once: the step
        is then discarded, and the member rewinds). Blocks while `max_queued_bytes` of values
        wait (at least one step is always taken): the member's back-pressure when the broker is
        slower than the decoder."""
        with self._cond:
            while self._thread is not None and self._error is None and self._full():
                self._cond.wait()
            self._raise_error()
            self._queue.append((step, on_committed))
            self._queued_bytes += step.size
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="codeclog-commit", daemon=True
                )
                self._thread.start()

    def join(self) -> None:
        """Until every queued step is committed or a failure stopped the thread; never
        raises (its failure stays for `take_error`)."""
        with self._cond:
            while self._thread is not None:
                self._cond.wait()

    def take_error(self) -> Exception | None:
        """The recorded failure, once."""
        with self._cond:
            error, self._error = self._error, None
            return error

    def _full(self) -> bool:
        return bool(self._queue) and self._queued_bytes >= self.max_queued_bytes

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        try:
            while self._next():
                pass
        except BaseException:  # an on_committed that raised (a bug): never leave join() hanging
            self._stopped()
            raise

    def _next(self) -> bool:
        """Write what is queued as one transaction; False once the thread has stopped (nothing
        queued, or a failure)."""
        with self._cond:
            batch, self._queue, self._queued_bytes = self._queue, [], 0
            if not batch:
                self._thread = None  # in the same hold as the check: submit starts a new one
            self._cond.notify_all()  # room in the queue again (or the thread has stopped)
        if not batch:
            return False
        try:
            self._write([step for step, _ in batch])
        except Exception as exc:  # Kafka's, a stuck call, or a bug: the member raises it
            with self._cond:
                self._error = exc
                self._queue, self._queued_bytes = [], 0  # discarded: the member rewinds
            self._stopped()
            return False
        self.transactions += 1
        self.most_steps = max(self.most_steps, len(batch))
        for _, on_committed in batch:
            on_committed()
        return True

    def _stopped(self) -> None:
        with self._cond:
            self._thread = None
            self._cond.notify_all()
