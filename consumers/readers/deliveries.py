"""What a listener yields and reports: its bounds (`ListenerConfig`), one delivery
(`ListenerChunk`), a stream's report and the listener's counters (consumers/readers/assembler.py
makes them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from codeclog.consumers.readers.audio_compare import Bound


@dataclasses.dataclass(frozen=True)
class ListenerConfig:
    max_open_streams: int = 1024
    max_pending: int = 4  # windows held per stream while an earlier one is missing
    keep_pcm: int = 2  # PCM of the newest delivered windows, for cross-domain comparison
    keep_digests: int = 32  # sha256 + domain of the newest delivered windows per stream
    max_ended: int = 10_000  # ended streams remembered (digests only)
    ended_ttl_s: float = 600.0  # ... for this long after they ended (past any outage timeout)
    # an open stream no copy of any window came for in this long is ended (`end == "idle"`): the
    # audio topic carries no end for a request aborted or evicted upstream
    idle_end_s: float = 600.0
    bound: Bound = dataclasses.field(default_factory=Bound)


@dataclasses.dataclass(frozen=True, slots=True)
class ListenerChunk:
    """One delivery: a window's PCM, or (pcm == b"", end set) a stream ended without audio."""

    request_id: str
    cache_epoch: int
    window_index: int
    sample_offset: int
    sample_rate_hz: int
    pcm: bytes
    final: bool  # this is the epoch's final window
    # None, "final", "superseded" (a newer epoch began), "evicted", "idle" (nothing came for
    # idle_end_s), "closed"
    end: str | None
    gap_samples: int  # samples missing right before this chunk (windows never received)
    received_at: float  # listener clock (Unix seconds) when the first copy arrived
    source_produced_at_ms: int
    determinism_domain: str
    written_at_ms: int = 0  # the audio record's Kafka timestamp (when the consumer produced it)
    committed: bool = False  # the copy played came from the committed audio topic (not live)

    def __iter__(self) -> Iterator[Any]:  # (request, pcm) unpacking
        return iter((self.request_id, self.pcm))


@dataclasses.dataclass
class StreamReport:
    request_id: str
    cache_epoch: int
    windows: int = 0
    samples: int = 0
    first_audio_latency_s: float | None = None  # first delivery - produced_at of window 0
    gap_windows: int = 0  # window indexes never received (skipped)
    gap_samples: int = 0
    max_interval_s: float = 0.0  # longest time between two deliveries of the stream
    confirmed: int = 0  # windows played whose committed copy arrived and matched
    duplicates: int = 0  # other later copies, identical (or within the bound across domains)
    mismatches: int = 0  # later copies that differ (bytes within a domain / beyond the bound)
    uncompared: int = 0  # later copies too old to compare (dropped all the same)
    end: str | None = None


@dataclasses.dataclass
class ListenerStats:
    records: int = 0
    delivered: int = 0
    confirmed: int = 0  # played windows whose committed copy matched (or was the one played)
    duplicates: int = 0
    differs_within_bound: int = 0
    mismatches: int = 0
    uncompared: int = 0
    corrupt: int = 0  # pcm not matching its own sha256: dropped, a later copy may be good
    skipped_old_epoch: int = 0  # older than the request's current epoch at start
    stale: int = 0  # a copy of an epoch older than the request's stream
    after_final: int = 0
    gap_windows: int = 0
    evicted: int = 0
    idle_ended: int = 0  # open streams ended after idle_end_s without a copy of any window
    # live copies past max_pending held behind a lost one, or of a newer epoch while the older
    # one is open: not played (their committed copies play them)
    live_set_aside: int = 0
