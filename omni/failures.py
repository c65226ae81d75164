"""How the connector's receiver fails a request, and what it remembers of the failures.
Reasons: docs/vllm-omni.md, "Re-dispatch: a dead replica's requests finish on another"."""

from __future__ import annotations

import collections
import logging
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from codeclog.omni.index import IndexKey
from codeclog.omni.tally import Tally

LOGGER = logging.getLogger("codeclog.omni")
FAILED_KEPT = 1000  # requests failed here that health() names, newest first
ERROR_KEY = "codeclog_error"  # where a failure terminal's meta carries the reason


class RequestFailures:
    """The failures of one receiver; thread-safe. Where the adapter was bound to the connector
    a failure goes through the adapter's own `record_receive_failure`; otherwise the failed
    request's next get returns a terminal payload in the adapter's own end-marker shape, with
    the reason under `meta.codeclog_error`. Either way it is logged, counted and named in
    `health()["failed_requests"]` (the newest FAILED_KEPT)."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self._lock = threading.Lock()
        self._failed: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._terminals: dict[IndexKey, tuple[Any, float]] = {}
        self._adapter: weakref.ref[Any] | None = None

    def bind(self, adapter: Any) -> None:
        self._adapter = weakref.ref(adapter)

    def fail(self, request: str, key: IndexKey | None, reason: str, now: float) -> None:
        """Fail `request`, whose adapter waits for `key` (None: it asks for none)."""
        LOGGER.error("codeclog connector: request %s failed: %s", request, reason)
        with self._lock:
            self._failed[request] = reason
            self._failed.move_to_end(request)
            while len(self._failed) > FAILED_KEPT:
                self._failed.popitem(last=False)
        adapter = self._adapter() if self._adapter is not None else None
        if adapter is not None and _fail_in_adapter(adapter, request, reason):
            self.tally.add("failed_through_adapter")
            return
        if key is not None:
            with self._lock:
                self._terminals[key] = (failure_terminal(reason), now)

    def terminal(self, key: IndexKey) -> Any:
        """The failure terminal waiting for `key`'s get, once (None when there is none)."""
        with self._lock:
            found = self._terminals.pop(key, None)
        if found is None:
            return None
        self.tally.add("failure_terminals")
        return found[0]

    def drop_stale(self, now: float, after_s: float) -> None:
        """Forget the terminals nobody asked for in `after_s`."""
        with self._lock:
            for key, (_payload, at) in list(self._terminals.items()):
                if now - at >= after_s:
                    del self._terminals[key]

    def named(self) -> dict[str, str]:
        with self._lock:
            return dict(self._failed)


def failure_terminal(reason: str) -> dict[str, Any]:
    """A failed request's last payload, in the shape of the adapter's own end marker."""
    import torch  # the receiving side hands tensors to vllm-omni anyway

    return {
        "meta": {
            "finished": torch.tensor(True),
            "is_segment_finished": torch.tensor(False),
            ERROR_KEY: reason,
        }
    }


def _fail_in_adapter(adapter: Any, request: str, reason: str) -> bool:
    """Fail the adapter's requests of external id `request` (its internal ids); False when
    it knows none (it never polled the request)."""
    mapping: Mapping[str, str] = dict(getattr(adapter, "request_ids_mapping", {}) or {})
    internal = [iid for iid, external in mapping.items() if external == request]
    for iid in internal:
        adapter.record_receive_failure(iid, reason)
    return bool(internal)
