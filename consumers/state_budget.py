"""A memory budget for open vocoder streams: bytes, not a count.

Every open stream is charged the peak size of its state (`Code2WavEngine.peak_state_bytes`):
its attention caches grow to prompt + 100 frames within a few windows and then stay there, so
charging what a state holds now would admit streams that overflow the device a few windows
later. A new stream is admitted when the charged bytes plus its own fit the budget.

The eviction rule: when a new stream does not fit, the least recently USED open stream (the one
whose last window is oldest; never one with a window in the round being decoded) is evicted,
then the next, until it fits. If it still does not fit (every open stream has a window in this
round), the new stream itself is refused. Both outcomes end that request's stream (dead letter
`evicted`, counted by cause "state_budget"). Idle streams go first because a stream whose
talker went quiet is the one least likely to be waited on; the fold's open-stream count cap
(`max_open_streams`, least recently opened) still applies on top.

Pure bookkeeping: no torch, no Kafka; the pipeline performs the evictions.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Collection


@dataclasses.dataclass(frozen=True, slots=True)
class Admission:
    """What admitting one new stream takes: the streams to evict first, or a refusal."""

    admitted: bool
    evict: tuple[str, ...]


class StateBudget:
    """Charged bytes of open streams in least-recently-used order. limit None: unbounded."""

    def __init__(self, limit_bytes: int | None, stream_bytes: int) -> None:
        if limit_bytes is not None and limit_bytes < 0:
            raise ValueError(f"state budget must be >= 0 bytes, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self.stream_bytes = max(0, int(stream_bytes))
        self._charged: collections.OrderedDict[str, int] = collections.OrderedDict()

    @property
    def charged_bytes(self) -> int:
        return sum(self._charged.values())

    @property
    def streams(self) -> int:
        return len(self._charged)

    def admit(self, request_id: str, busy: Collection[str]) -> Admission:
        """Whether `request_id`'s new stream fits, and which least recently used streams not
        in `busy` must be evicted first. Changes nothing: the caller evicts, then `add`s."""
        if self.limit_bytes is None:
            return Admission(True, ())
        free = self.limit_bytes - self.charged_bytes + self._charged.get(request_id, 0)
        victims: list[str] = []
        for rid, charged in self._charged.items():
            if free >= self.stream_bytes:
                break
            if rid == request_id or rid in busy:
                continue
            victims.append(rid)
            free += charged
        if free < self.stream_bytes:
            return Admission(False, ())
        return Admission(True, tuple(victims))

    def add(self, request_id: str) -> None:
        self._charged.pop(request_id, None)
        self._charged[request_id] = self.stream_bytes

    def touch(self, request_id: str) -> None:
        """The stream decoded a window: it becomes the most recently used."""
        if request_id in self._charged:
            self._charged.move_to_end(request_id)

    def release(self, request_id: str) -> None:
        self._charged.pop(request_id, None)

    def over_budget(self) -> bool:
        return self.limit_bytes is not None and self.charged_bytes > self.limit_bytes
