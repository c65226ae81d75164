"""A one-line progress bar on stderr for long captures and replays."""

from __future__ import annotations

import sys
from collections.abc import Callable


class StderrProgress:
    """Redrawn in place at most every `interval_s` on a terminal (a new line every 5 s when
    stderr is a file), and only once the work has taken `delay_s`: short runs stay quiet."""

    def __init__(
        self,
        monotonic: Callable[[], float],
        label: str,
        unit: str,
        written_label: str | None = None,
        delay_s: float = 1.0,
        interval_s: float = 0.5,
    ) -> None:
        self._monotonic = monotonic
        self._label = label
        self._unit = unit
        self._written_label = written_label
        self._started = monotonic()
        self._delay_s = delay_s
        self._interval_s = interval_s
        self._last = 0.0
        self._shown = False
        self._tty = sys.stderr.isatty()

    def update(self, done: int, total: int, written: int) -> None:
        now = self._monotonic()
        interval = self._interval_s if self._tty else max(self._interval_s, 5.0)
        if now - self._started < self._delay_s or now - self._last < interval:
            return
        self._last = now
        self._shown = True
        print(self.line(done, total, written), end="\r" if self._tty else "\n", file=sys.stderr)

    def line(self, done: int, total: int, written: int) -> str:
        share = done / total if total else 1.0
        bar = "#" * int(share * 30)
        text = f"{self._label}: [{bar:<30}] {share:6.1%} of {total:,} {self._unit}"
        if self._written_label:
            text += f", {written:,} {self._written_label}"
        return text

    def close(self) -> None:
        if self._shown and self._tty:
            print(file=sys.stderr)
