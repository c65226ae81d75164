"""One (request, epoch) stream of the listener: its windows played in order, each once.
Reasons: docs/listening.md."""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable

from codeclog.consumers.readers.audio_compare import compare_bound
from codeclog.consumers.readers.deliveries import (
    ListenerChunk,
    ListenerConfig,
    ListenerStats,
    StreamReport,
)
from codeclog.schemas.records import AudioChunk

log = logging.getLogger("codeclog.listen")


@dataclasses.dataclass(slots=True)
class Seen:
    sha256: str
    domain: str
    pcm: bytes | None
    confirmed: bool = False  # its committed copy arrived (or was the copy played)


@dataclasses.dataclass(slots=True)
class Held:
    """The first copy of a window not played yet: when it arrived, whether it is the committed
    copy, whether a committed copy of it arrived (it is then confirmed when played)."""

    chunk: AudioChunk
    arrived: float
    written_at_ms: int
    committed: bool
    confirmed: bool = False


class EpochStream:
    """One (request, epoch) stream: its windows played in order, each once.

    `window` takes the first copy of a window: it is played when every window before it has
    been (`_drain`), or held (`pending`) behind a gap until committed copies prove the gap was
    never written (`_bound_pending`, `skip_gap`): a lost live copy is no gap. A later copy of a
    window (`later_copy`) is compared with the first (bytes within a determinism domain, the
    numeric bound of consumers.readers.audio_compare across domains), counted, and never played
    twice: the committed copy that matches the window played counts as its confirmation
    (`confirmed`), any other identical copy as a duplicate. At most `max_pending` windows are
    held, the PCM of the last `keep_pcm` played windows is kept for cross-domain comparison and
    the digests of the last `keep_digests`. The `Assembler` owns the streams: which are open,
    ended or replaced by a newer epoch, and when each ends.

    `on_final` is told when the final window was played, before it is returned: the owner
    retires the stream (`release`) and keeps its digests for later copies."""

    __slots__ = (
        "_on_final",
        "config",
        "ended_at",
        "heard_at",
        "last_at",
        "next_index",
        "next_sample",
        "pcm_kept",
        "pending",
        "report",
        "seen",
        "stats",
        "successors",
    )

    def __init__(
        self,
        request_id: str,
        epoch: int,
        config: ListenerConfig,
        stats: ListenerStats,
        on_final: Callable[[EpochStream, float], None],
    ) -> None:
        self.config = config
        self.stats = stats  # the listener's, shared by all its streams
        self._on_final = on_final
        self.report = StreamReport(request_id, epoch)
        self.next_index = 0
        self.next_sample = 0
        self.pending: dict[int, Held] = {}
        self.seen: collections.OrderedDict[int, Seen] = collections.OrderedDict()
        self.pcm_kept: collections.deque[int] = collections.deque()
        self.last_at: float | None = None
        self.heard_at = 0.0  # listener clock: when a copy of any of its windows last came
        self.ended_at = 0.0  # listener clock: when it ended, or was replaced by a newer epoch
        # live copies of a newer epoch that came while this one was open: folded once it ends
        self.successors: list[Held] = []

    @property
    def epoch(self) -> int:
        return self.report.cache_epoch

    @property
    def ended(self) -> bool:
        return self.report.end is not None

    def buffered_bytes(self) -> int:
        held = sum(len(h.chunk.pcm_s16le) for h in (*self.pending.values(), *self.successors))
        return held + sum(len(s.pcm) for s in self.seen.values() if s.pcm is not None)

    def release(self) -> list[Held]:
        """Drop what an ended stream holds (pending windows, kept PCM; the digests stay) and
        hand over the live copies of a newer epoch held for its end."""
        self.pending.clear()
        successors, self.successors = self.successors, []
        for seen in self.seen.values():
            seen.pcm = None
        self.pcm_kept.clear()
        return successors

    def window(self, copy: Held, now: float) -> list[ListenerChunk]:
        """Fold a copy of one of its windows: the windows it lets play, in order."""
        index = copy.chunk.window_index
        if index < self.next_index or index in self.pending:
            self.later_copy(copy.chunk, copy.committed)
            held = index in self.pending  # its committed copy may prove a gap before it
            return self._bound_pending(now) if held else []
        if self.ended:
            self.stats.after_final += 1
            return []
        self.pending[index] = copy
        out = self._drain(now)
        if self.pending:
            out += self._bound_pending(now)
        return out

    def _bound_pending(self, now: float) -> list[ListenerChunk]:
        """Windows held behind a gap: skip it once committed copies prove it (an epoch's
        committed copies come in window order, so a committed final, or more than
        `max_pending` committed copies, beyond it say its windows were never written), else
        wait for its committed copies, setting aside the newest live copies beyond
        `max_pending` (their committed copies will play them): a live copy is best effort, and
        one lost is no gap."""
        # `confirmed`: its committed copy has arrived (it is that copy, or that copy came for it)
        proven = [h for h in self.pending.values() if h.confirmed]
        if len(proven) > self.config.max_pending or any(h.chunk.final for h in proven):
            return self.skip_gap(now)
        while len(self.pending) > self.config.max_pending:
            live = [i for i, h in self.pending.items() if not h.confirmed]
            del self.pending[max(live)]
            self.stats.live_set_aside += 1
        return []

    def _drain(self, now: float) -> list[ListenerChunk]:
        out = []
        while self.next_index in self.pending and not self.ended:
            out.append(self._deliver(self.pending.pop(self.next_index), now))
        return out

    def skip_gap(self, now: float) -> list[ListenerChunk]:
        out: list[ListenerChunk] = []
        while self.pending and not self.ended:
            first = min(self.pending)
            missing = first - self.next_index
            self.report.gap_windows += missing
            self.stats.gap_windows += missing
            log.warning("request %s epoch %d: windows %d..%d never arrived",
                        self.report.request_id, self.epoch, self.next_index, first - 1)  # fmt: skip
            self.next_index = first
            out += self._drain(now)
        return out

    def _deliver(self, held: Held, now: float) -> ListenerChunk:
        chunk, arrived = held.chunk, held.arrived
        report = self.report
        gap = max(0, chunk.sample_offset - self.next_sample) if self.next_index > 0 else 0
        if self.next_index == 0:
            gap = max(0, chunk.sample_offset)
        report.gap_samples += gap
        samples = len(chunk.pcm_s16le) // 2
        self.next_index = chunk.window_index + 1
        self.next_sample = chunk.sample_offset + samples
        report.windows += 1
        report.samples += samples
        if report.first_audio_latency_s is None and chunk.source_produced_at_ms > 0:
            report.first_audio_latency_s = max(0.0, arrived - chunk.source_produced_at_ms / 1000)
        if self.last_at is not None:
            report.max_interval_s = max(report.max_interval_s, now - self.last_at)
        self.last_at = now
        self._remember(chunk, held.confirmed)
        self.stats.delivered += 1
        if held.confirmed:
            report.confirmed += 1
            self.stats.confirmed += 1
        if chunk.final:
            report.end = "final"
            self._on_final(self, now)
        return ListenerChunk(
            chunk.request_id,
            chunk.cache_epoch,
            chunk.window_index,
            chunk.sample_offset,
            chunk.sample_rate_hz,
            chunk.pcm_s16le,
            chunk.final,
            report.end,
            gap,
            arrived,
            chunk.source_produced_at_ms,
            chunk.determinism_domain,
            held.written_at_ms,
            held.committed,
        )

    def _remember(self, chunk: AudioChunk, confirmed: bool) -> None:
        keep = self.config.keep_pcm > 0
        self.seen[chunk.window_index] = Seen(
            chunk.sha256, chunk.determinism_domain, chunk.pcm_s16le if keep else None, confirmed
        )
        if keep:
            self.pcm_kept.append(chunk.window_index)
            while len(self.pcm_kept) > self.config.keep_pcm:
                old = self.seen.get(self.pcm_kept.popleft())
                if old is not None:
                    old.pcm = None
        while len(self.seen) > self.config.keep_digests:
            self.seen.popitem(last=False)

    def later_copy(self, chunk: AudioChunk, committed: bool) -> None:
        held = self.pending.get(chunk.window_index)
        if held is not None:
            first = Seen(held.chunk.sha256, held.chunk.determinism_domain, held.chunk.pcm_s16le)
        else:
            found = self.seen.get(chunk.window_index)
            if found is None:
                self.report.uncompared += 1
                self.stats.uncompared += 1
                return
            first = found
        if first.sha256 == chunk.sha256:
            self._same(held, first, committed)
            return
        same_domain = first.domain == chunk.determinism_domain and first.domain != ""
        if not same_domain and first.pcm is not None:
            verdict = compare_bound(first.pcm, chunk.pcm_s16le, self.config.bound)
            if verdict.ok:
                self.stats.differs_within_bound += 1
                self._same(held, first, committed)
                return
        elif not same_domain:
            self.report.uncompared += 1
            self.stats.uncompared += 1
            return
        self.report.mismatches += 1
        self.stats.mismatches += 1
        log.warning(
            "request %s epoch %d window %d: a later copy differs (%s vs %s); the first was played",
            chunk.request_id,
            chunk.cache_epoch,
            chunk.window_index,
            first.domain or "unknown",
            chunk.determinism_domain or "unknown",
        )

    def _same(self, held: Held | None, first: Seen, committed: bool) -> None:
        """A later copy equal to the first: the committed one confirms it, others duplicate."""
        if held is not None and committed and not held.confirmed:
            held.confirmed = True  # counted when it is played
            return
        if held is None and committed and not first.confirmed:
            first.confirmed = True
            self.report.confirmed += 1
            self.stats.confirmed += 1
            return
        self.report.duplicates += 1
        self.stats.duplicates += 1
