"""The connector's counters and last error, shared by its sending and receiving sides."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict

LOGGER = logging.getLogger("codeclog.omni")


class Tally:
    """Thread-safe counters; `failed` logs, counts `<what>_failures` and keeps the reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = defaultdict(int)
        self.last_error = ""

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    def failed(self, what: str, key: str, reason: str) -> None:
        LOGGER.error("codeclog connector %s %s failed: %s", what, key, reason)
        with self._lock:
            self._counts[f"{what}_failures"] += 1
            self.last_error = f"{what} {key}: {reason}"

    def error(self, text: str, counter: str = "") -> bool:
        """Keep `text` as the last error (counting `counter`); False when it was already."""
        with self._lock:
            if counter:
                self._counts[counter] += 1
            told = self.last_error == text
            self.last_error = text
        return not told

    def failures(self) -> int:
        with self._lock:
            return sum(v for k, v in self._counts.items() if k.endswith("_failures"))

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
