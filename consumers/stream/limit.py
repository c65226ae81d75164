"""How many open streams one input partition may hold: the open-stream cap and the state budget as
one count per partition (rule C1a, docs/fold-contract.md). Pure arithmetic: no torch, no Kafka.
Reasons: docs/operating.md, "Memory and bounds"."""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

from codeclog.errors import ConfigError

EVICTED_BY_CAP = "open_stream_cap"  # the eviction metric's causes
EVICTED_BY_BUDGET = "state_budget"


@dataclasses.dataclass(frozen=True, slots=True)
class StreamLimit:
    """Open streams allowed per input partition, and which bound decided it."""

    per_partition: int
    cause: str
    partitions: int
    max_open_streams: int
    budget_bytes: int | None = None
    stream_bytes: int = 0

    def describe(self) -> str:
        """One line for logs and summaries."""
        text = (
            f"at most {self.per_partition} open streams per partition "
            f"({self.partitions} partitions; cap {self.max_open_streams}"
        )
        if self.budget_bytes is not None:
            text += (
                f", state budget {self.budget_bytes / 1e6:.1f} MB at "
                f"{self.stream_bytes / 1e6:.1f} MB per stream"
            )
        return f"{text}; {self.cause} decides)"


def stream_limit(
    max_open_streams: int,
    partitions: int,
    budget_bytes: int | None = None,
    stream_bytes: int = 0,
) -> StreamLimit:
    """The per-partition limit of `max_open_streams` over the group and a member's state budget
    (None: none; `stream_bytes` 0: the engine does not say, so the budget cannot bind)."""
    if max_open_streams < 1:
        raise ConfigError(f"--max-open-streams must be >= 1, got {max_open_streams}")
    if partitions < 1:
        raise ConfigError(f"the chunk topic must have at least one partition, got {partitions}")
    if budget_bytes is not None and budget_bytes < 0:
        raise ConfigError(f"the state budget must be >= 0 bytes, got {budget_bytes}")
    by_cap = max(1, max_open_streams // partitions)
    limit = StreamLimit(by_cap, EVICTED_BY_CAP, partitions, max_open_streams)
    if budget_bytes is None or stream_bytes <= 0:
        return limit
    by_budget = budget_bytes // stream_bytes // partitions
    if by_budget < 1:
        raise ConfigError(
            f"the state budget of {budget_bytes / 1e6:.1f} MB holds "
            f"{budget_bytes // stream_bytes} streams of {stream_bytes / 1e6:.1f} MB, fewer than "
            f"one per partition of the chunk topic ({partitions}): raise --state-budget-mb to "
            f"at least {partitions * stream_bytes / 1e6:.1f}"
        )
    limit = dataclasses.replace(limit, budget_bytes=budget_bytes, stream_bytes=stream_bytes)
    if by_budget < by_cap:
        return dataclasses.replace(limit, per_partition=by_budget, cause=EVICTED_BY_BUDGET)
    return limit


@dataclasses.dataclass(frozen=True, slots=True)
class LimitOptions:
    """What `vocode`, `verify` and `replay` take (`--max-open-streams`, `--state-budget-mb`):
    resolved against the chunk topic's partitions and the engine in `resolve`, so the three
    apply the same limit from the same options."""

    max_open_streams: int = 1024
    state_budget_mb: float | None = None  # None: the engine's default budget, if it has one

    def resolve(self, partitions: int, engine: object | None) -> StreamLimit:
        """The limit for an engine (None: no vocoder, so no state budget)."""
        return stream_limit(
            self.max_open_streams,
            partitions,
            self.budget_bytes(engine),
            engine.peak_state_bytes() if isinstance(engine, StateSizes) else 0,
        )

    def budget_bytes(self, engine: object | None) -> int | None:
        if engine is None:
            return None
        if self.state_budget_mb is not None:
            return int(self.state_budget_mb * 1_000_000)
        return engine.default_state_budget_bytes() if isinstance(engine, StateSizes) else None


@runtime_checkable
class StateSizes(Protocol):
    """The size figures an engine states (Code2WavEngine does; a test double may not, and then
    no budget applies): part of `consumers.stream.pipeline.EngineFacts`."""

    def peak_state_bytes(self) -> int:
        """The most bytes one open stream's state holds between windows."""
        ...

    def default_state_budget_bytes(self) -> int:
        """The open-stream state budget when --state-budget-mb is not given."""
        ...
