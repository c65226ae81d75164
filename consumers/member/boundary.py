"""The transaction boundary as the member sees it: `TransactionBoundary`, everything the member
asks of its transactions (consumers/member/transaction.py has its one implementation)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from confluent_kafka import KafkaException

from codeclog.consumers.member.step_writes import StepWrites
from codeclog.kafka.calls import StuckCallError

TransactionError = KafkaException | StuckCallError
# the same, for `except`: a failed transaction call (the one spelling of it)
TRANSACTION_ERRORS = (KafkaException, StuckCallError)


class TransactionBoundary(Protocol):
    """Everything the member asks of its transactions (and nothing is set on them)."""

    @property
    def abandoned(self) -> int:
        """Producers given up on (stuck or fatal): the process must not destroy them."""

    @property
    def committing(self) -> bool:
        """Steps are queued or being written."""

    def start(self, retry_for_s: float, stop: threading.Event) -> None:
        """A producer with transactions initialised (fencing a predecessor)."""

    def ensure_producer(self, reason: str = "") -> None:
        """Replace a producer given up on; finish a pending initialisation."""

    def await_commit(self) -> None:
        """Wait until every queued step is committed; raise a failure here (once)."""

    def write_step(self, step: StepWrites, on_committed: Callable[[], None]) -> None:
        """Queue a step (its records and consumed positions) for a transaction written in the
        background, with whatever else queued; `on_committed` runs after a commit that counts.
        Raises the failure of an earlier transaction instead (once)."""

    def join(self) -> None:
        """Wait for the queued steps without raising (a failure stays recorded)."""

    def handle_error(self, exc: TransactionError) -> None:
        """Abort (or give up on the producer) after a failed call; raise when the member must
        end (fenced, refused)."""

    def mark_wedged(self) -> None:
        """A call around the producer got stuck: replace it before the next transaction."""

    def end_on_failure(self) -> None:
        """The member is ending: short bounds, the commit joined, the open one aborted."""

    def end_refused(self) -> None:
        """The member is ending on a refusal: short bounds, nothing aborted (it would be
        refused too)."""

    def close(self) -> None:
        """Flush and drop the producer."""
