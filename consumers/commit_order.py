"""The order of overlapping transactions: at most two in flight, committed in step order, a
failure aborts every later step with it.

The explicit state machine behind `vocode --overlap-transactions`
(consumers/overlap_transactions.py runs it with threads and Kafka; this module knows neither).
A step begins (`begin`), is handed to its commit (`request_commit`), and a commit thread asks
`verdict` until it may act: COMMIT once every earlier step has committed, ABORT once an earlier
step (or the step itself) failed. `committed` / `failed` record the outcome.

Why in order and together: step N+1's consumed offsets cover step N's inputs too (the consumer's
positions only grow), so committing N+1 alone would mark N's inputs as done while N's audio
never became visible: a lost window. N+1 therefore commits only after N committed, and if N
fails N+1 is aborted with it; the consumer then rewinds to the committed offsets and reads both
steps' inputs again.
"""

from __future__ import annotations

import dataclasses
import enum

IN_FLIGHT_LIMIT = 2


class Verdict(enum.Enum):
    COMMIT = "commit"  # every earlier step committed: this one's commit may be issued
    ABORT = "abort"  # this step or an earlier one failed: never commit it


class OrderError(RuntimeError):
    """A call the order forbids (a bug in the caller, never a Kafka failure)."""


@dataclasses.dataclass
class CommitOrder:
    """Steps in flight (begun, not yet committed or aborted), oldest first."""

    limit: int = IN_FLIGHT_LIMIT
    _open: list[int] = dataclasses.field(default_factory=list)  # begun, commit not requested
    _committing: set[int] = dataclasses.field(default_factory=set)  # commit requested
    _aborted: set[int] = dataclasses.field(default_factory=set)  # failed; the caller rewinds
    _next: int = 0
    _in_flight: list[int] = dataclasses.field(default_factory=list)

    @property
    def in_flight(self) -> tuple[int, ...]:
        return tuple(self._in_flight)

    @property
    def failed_pending(self) -> bool:
        """A failure the caller has not rewound from yet (`rewound`): nothing may begin."""
        return bool(self._aborted)

    def slot(self, step: int) -> int:
        """Which of the `limit` producers carries `step` (they alternate)."""
        return step % self.limit

    def can_begin(self) -> bool:
        return len(self._in_flight) < self.limit and not self._aborted

    def begin(self) -> int:
        """A new step, on the producer whose previous step is resolved."""
        if self._aborted:
            raise OrderError("a step failed: rewind before beginning another")
        if len(self._in_flight) >= self.limit:
            raise OrderError(f"{self.limit} transactions already in flight")
        step = self._next
        self._next += 1
        self._in_flight.append(step)
        self._open.append(step)
        return step

    def request_commit(self, step: int) -> bool:
        """The step's records and offsets are sent; False if it was aborted meanwhile."""
        if step not in self._in_flight:
            return False  # aborted (and perhaps rewound since)
        if step not in self._open:
            raise OrderError(f"step {step} is not open")
        self._open.remove(step)
        self._committing.add(step)
        return True

    def verdict(self, step: int) -> Verdict | None:
        """What the commit of `step` may do now; None: wait (an earlier step is in flight)."""
        if step not in self._in_flight:
            return Verdict.ABORT  # aborted (or given up on and rewound since)
        if step not in self._committing:
            raise OrderError(f"step {step} has no commit requested")
        return Verdict.COMMIT if self._in_flight[0] == step else None

    def committed(self, step: int) -> bool:
        """The step's commit succeeded. False: it had been given up on meanwhile (a stuck
        commit abandoned by `failed`), so it no longer counts here."""
        if step not in self._in_flight:
            return False
        if self.verdict(step) is not Verdict.COMMIT:
            raise OrderError(f"step {step} committed before an earlier step")
        self._in_flight.remove(step)
        self._committing.discard(step)
        return True

    def failed(self, step: int) -> list[int]:
        """The step failed (or was given up on): it and every later step in flight are aborted.
        Returns the steps aborted by this call, oldest first."""
        if step not in self._in_flight:
            return []
        cut = self._in_flight.index(step)
        aborted = self._in_flight[cut:]
        del self._in_flight[cut:]
        for s in aborted:
            if s in self._open:
                self._open.remove(s)
            self._committing.discard(s)
        self._aborted.update(aborted)
        return aborted

    def rewound(self) -> None:
        """The caller aborted the failed steps' transactions and rewound: begin again."""
        if self._in_flight:
            raise OrderError(f"steps {self._in_flight} still in flight")
        self._aborted.clear()
