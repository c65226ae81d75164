"""How long the member has been failing: the clock behind `outage_timeout_s`.
Reasons: docs/operating.md, "Liveness bounds"."""

from __future__ import annotations

import time
from collections.abc import Callable

from codeclog.kafka.calls import InfrastructureError, OpenTransactionError, one_line


class OutageClock:
    """Failures since the last commit, against the outage limit."""

    def __init__(
        self,
        limit_s: float,
        where: str,
        clock: Callable[[], float] = time.monotonic,
        open_transaction_s: float = 0.0,
    ) -> None:
        self.limit_s = limit_s
        self.open_transaction_s = open_transaction_s
        self.where = where  # the cluster, for the message
        self._clock = clock
        self.failing_since: float | None = None  # first failure since the last commit
        self._last_failure_at: float | None = None
        self.last_error = ""

    def committed(self) -> None:
        self.failing_since = None

    def failed(self, exc: BaseException) -> None:
        """Count a failure; InfrastructureError (exit 1: the next member resumes from the
        committed offsets) once failing longer than the limit. The clock runs from the first
        failure since the last commit; a failure long after the previous one (an idle member
        that commits nothing) starts it again. A recovery that waits for a transaction left
        open (OpenTransactionError: a member killed mid-transaction) waits at least
        `open_transaction_s`, the time the coordinator takes to abort it."""
        now = self._clock()
        quiet_since = self._last_failure_at
        if quiet_since is not None and now - quiet_since > self.limit_s:
            self.failing_since = None
        self._last_failure_at = now
        if self.failing_since is None:
            self.failing_since = now
        self.last_error = one_line(exc)
        failing_s = now - self.failing_since
        limit_s = self.limit_s
        if isinstance(exc, OpenTransactionError):
            limit_s = max(limit_s, self.open_transaction_s)
        if failing_s > limit_s:
            raise InfrastructureError(
                f"no transaction committed for {failing_s:.0f} s: the cluster at "
                f"{self.where} keeps failing ({self.last_error}); giving up (the next "
                "member resumes from the committed offsets)"
            )
