"""The replay report: what a policy did with a stream of events, built from the outcomes alone.
Its shape: tests/data/scenarios/README.md; its status rules: docs/fold-contract.md, "The report".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from codeclog.consumers.stream.fold.outcomes import (
    Abandoned,
    Decode,
    Gap,
    Hold,
    Marker,
    Outcome,
    Reject,
    RejectReason,
    Release,
)
from codeclog.consumers.stream.fold.rules import Event, fold
from codeclog.consumers.stream.fold.state import FoldConfig, Policy, new_state

OPEN = "open"
RELEASED = "released"
KILLED = "killed"
_OPENING = (Hold, Marker, Gap, Abandoned)  # outcomes only an open stream produces


class ReportBuilder:
    """Builds the report incrementally: call `add` after every `fold`, then `result`.

    It infers each request's status from the outcomes alone (the rules above), so it needs no
    access to the fold state; tests check it agrees with `state.open_requests`.
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.events = 0
        self.unprocessed = 0
        self.fatal: Reject | None = None
        self._requests: dict[str, dict[str, Any]] = {}
        self._open: set[str] = set()

    def add(self, event: Event, outcomes: Sequence[Outcome]) -> None:
        if self.fatal is not None:
            self.unprocessed += 1
            return
        self.events += 1
        self._entry(event.request_id)
        for outcome in outcomes:
            self._entry(outcome.request_id)["outcomes"].append(outcome.to_report())
            self._track(outcome)

    def _entry(self, request_id: str) -> dict[str, Any]:
        entry = self._requests.get(request_id)
        if entry is None:
            entry = self._requests[request_id] = {"status": RELEASED, "outcomes": []}
        return entry

    def _track(self, outcome: Outcome) -> None:
        rid = outcome.request_id
        if isinstance(outcome, Release):
            self._set(rid, RELEASED)
        elif isinstance(outcome, _OPENING) or (isinstance(outcome, Decode) and not outcome.final):
            self._set(rid, OPEN)
        elif isinstance(outcome, Reject):
            self._rejected(outcome)

    def _rejected(self, reject: Reject) -> None:
        if self.policy is Policy.STRICT and reject.reason is not RejectReason.EVICTED:
            self.fatal = reject
            for rid in (*self._open, reject.request_id):
                self._requests[rid]["status"] = KILLED
        elif reject.reason is RejectReason.EMPTY_NONFINAL_CHUNK:
            self._set(reject.request_id, OPEN)  # A3: the position advanced, the stream is open

    def _set(self, rid: str, status: str) -> None:
        self._requests[rid]["status"] = status
        if status == OPEN:
            self._open.add(rid)
        else:
            self._open.discard(rid)

    def result(self) -> dict[str, Any]:
        fatal = None
        if self.fatal is not None:
            fatal = {
                "reason": self.fatal.reason.value,
                "request_id": self.fatal.request_id,
                "cache_epoch": self.fatal.cache_epoch,
                "chunk_seq": self.fatal.chunk_seq,
            }
        return {
            "policy": self.policy.value,
            "events": self.events,
            "unprocessed": self.unprocessed,
            "stage": {"fatal": fatal},
            "requests": {rid: dict(entry) for rid, entry in self._requests.items()},
        }


def build_report(events: Iterable[Event], config: FoldConfig | None = None) -> dict[str, Any]:
    """Fold every event under `config` (default: tolerant) and report what happened."""
    config = config or FoldConfig()
    state = new_state(config)
    builder = ReportBuilder(config.policy)
    for event in events:
        state, outcomes = fold(state, event)
        builder.add(event, outcomes)
    return builder.result()


def strict_error_json(reject: Reject) -> str:
    """The upstream error text of a rejection: `{"reason": ..., **details}`, sorted, compact.

    The upstream raises `RuntimeError("MiniCPMO45Code2WavBatchError " + this)`.
    """
    body = {"reason": reject.reason.value, **reject.details_dict()}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))
