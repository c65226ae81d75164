"""The pure listener: decoded AudioChunks in, ordered de-duplicated deliveries out.

`Assembler` yields `ListenerChunk`s per (request, epoch), in window order (window_index;
sample_offset places the PCM), each window once, with a clear end of stream (`end == "final"` on
the epoch's final window). A missing window is waited for until committed copies prove it was
never written (`_bound_pending`): a lost live copy is no gap. A later copy of a window is
compared with the first (bytes within a determinism domain, the numeric bound of
consumers.readers.audio_compare across domains), counted, and never played twice. A
speculative listener gets two copies of every window (the live one, then the committed one,
docs/listening.md) and more after a re-decode: the committed copy that matches the window
played counts as its confirmation (`confirmed`), any other identical copy as a duplicate.
consumers/readers/listener.py feeds it from Kafka.

Memory is bounded (ListenerConfig): at most `max_open_streams` open streams (the least recently
opened is ended with `end == "evicted"` beyond it), per stream at most `max_pending` windows
held out of order and `max_pending` live copies of a newer epoch held until it ends, the PCM
of the last `keep_pcm` delivered windows (for cross-domain comparison of later copies) and the
digests of the last `keep_digests`; ended streams keep
their digests only, in an LRU of `max_ended` (each request's newest epoch) and another of
`max_ended` (epochs a newer one replaced: their committed copies can come after it began), each
for `ended_ttl_s` after it ended or was replaced (a listener of named requests keeps its few for
good): a listener runs for days and sees thousands of streams an hour, and a later copy of a
window comes within a transaction's time, or from a re-decode within a member's outage timeout,
not hours later. An open stream that no copy of any window came for in `idle_end_s` is ended
(`end == "idle"`, `expire`): the audio topic carries no end for a request aborted or evicted
upstream, and such streams would otherwise stay open, with their kept PCM, until the cap.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Iterable

from codeclog.consumers.readers.audio_compare import compare_bound, pcm_digest
from codeclog.consumers.readers.deliveries import (
    ListenerChunk,
    ListenerConfig,
    ListenerStats,
    StreamReport,
)
from codeclog.schemas.records import AudioChunk

log = logging.getLogger("codeclog.listen")


@dataclasses.dataclass(slots=True)
class _Seen:
    sha256: str
    domain: str
    pcm: bytes | None
    confirmed: bool = False  # its committed copy arrived (or was the copy played)


@dataclasses.dataclass(slots=True)
class _Held:
    """The first copy of a window not played yet: when it arrived, whether it is the committed
    copy, whether a committed copy of it arrived (it is then confirmed when played)."""

    chunk: AudioChunk
    arrived: float
    written_at_ms: int
    committed: bool
    confirmed: bool = False


class _Stream:
    __slots__ = (
        "ended_at",
        "heard_at",
        "last_at",
        "next_index",
        "next_sample",
        "pcm_kept",
        "pending",
        "report",
        "seen",
        "successors",
    )

    def __init__(self, request_id: str, epoch: int) -> None:
        self.report = StreamReport(request_id, epoch)
        self.next_index = 0
        self.next_sample = 0
        self.pending: dict[int, _Held] = {}
        self.seen: collections.OrderedDict[int, _Seen] = collections.OrderedDict()
        self.pcm_kept: collections.deque[int] = collections.deque()
        self.last_at: float | None = None
        self.heard_at = 0.0  # listener clock: when a copy of any of its windows last came
        self.ended_at = 0.0  # listener clock: when it ended, or was replaced by a newer epoch
        # live copies of a newer epoch that came while this one was open: folded once it ends
        self.successors: list[_Held] = []

    @property
    def epoch(self) -> int:
        return self.report.cache_epoch

    @property
    def ended(self) -> bool:
        return self.report.end is not None

    def buffered_bytes(self) -> int:
        held = sum(len(h.chunk.pcm_s16le) for h in (*self.pending.values(), *self.successors))
        return held + sum(len(s.pcm) for s in self.seen.values() if s.pcm is not None)


class Assembler:
    """The pure listener: decoded audio chunks in, ordered de-duplicated deliveries out."""

    def __init__(
        self,
        config: ListenerConfig | None = None,
        requests: Iterable[str] = (),
        epoch_floor: dict[str, int] | None = None,
    ) -> None:
        self.config = config or ListenerConfig()
        self.requests = frozenset(requests)
        self.epoch_floor = dict(epoch_floor or {})  # request -> its current epoch at start
        self.stats = ListenerStats()
        self._open: collections.OrderedDict[str, _Stream] = collections.OrderedDict()
        self._ended: collections.OrderedDict[str, _Stream] = collections.OrderedDict()
        # streams a newer epoch of their request replaced (digests only), by (request, epoch)
        self._older: collections.OrderedDict[tuple[str, int], _Stream] = collections.OrderedDict()
        # every ended stream's report, superseded epochs included (_ended keeps one per request)
        self._finished: collections.deque[StreamReport] = collections.deque(
            maxlen=self.config.max_ended
        )
        self._expired_at = 0.0  # listener clock: the last look for idle streams
        # copies held for a stream that has ended since: folded next (`_replay`)
        self._released: collections.deque[_Held] = collections.deque()

    # -- queries --------------------------------------------------------------------------------

    def open_streams(self) -> int:
        return len(self._open)

    def buffered_bytes(self) -> int:
        """PCM bytes the listener holds (pending windows and kept copies for comparison)."""
        return sum(stream.buffered_bytes() for stream in self._open.values())

    def max_buffered_bytes(self, window_bytes: int) -> int:
        """The bound on buffered_bytes() when no window exceeds `window_bytes`."""
        per_stream = (2 * self.config.max_pending + self.config.keep_pcm) * window_bytes
        return self.config.max_open_streams * per_stream

    def remembered_streams(self) -> int:
        return len(self._open) + len(self._ended) + len(self._older)

    def reports(self) -> list[StreamReport]:
        """Every stream's report: the ended ones (the newest `max_ended`), then the open ones."""
        return [*self._finished, *(s.report for s in self._open.values())]

    def waiting_on_older_epochs(self) -> dict[str, int]:
        """Request -> its open epoch, for the requests whose newer epoch's live copies wait for
        that epoch to end (`_hold_successor`: held, the newest beyond `max_pending` set aside);
        after a barge-in it ends when the newer epoch's first committed copy comes
        (docs/listening.md)."""
        return {rid: stream.epoch for rid, stream in self._open.items() if stream.successors}

    def ended(self, request_id: str) -> StreamReport | None:
        stream = self._open.get(request_id) or self._ended.get(request_id)
        return stream.report if stream is not None and stream.ended else None

    # -- the fold of one chunk ------------------------------------------------------------------

    def offer(
        self, chunk: AudioChunk, now: float, written_at_ms: int = 0, committed: bool = True
    ) -> list[ListenerChunk]:
        """Fold one copy of a window (`written_at_ms`: its record's Kafka timestamp, if known;
        `committed`: it comes from the committed audio topic, not the live one)."""
        self.stats.records += 1
        rid = chunk.request_id
        if self.requests and rid not in self.requests:
            return []
        if chunk.cache_epoch < self.epoch_floor.get(rid, -(2**62)):
            self.stats.skipped_old_epoch += 1
            return []
        if pcm_digest(chunk.pcm_s16le) != chunk.sha256:
            self.stats.corrupt += 1
            log.warning("corrupt window %s epoch %d #%d dropped", rid, chunk.cache_epoch,
                        chunk.window_index)  # fmt: skip
            return []
        copy = _Held(chunk, now, written_at_ms, committed, committed)
        return self._fold(copy, now) + self._replay(now)

    def _fold(self, copy: _Held, now: float) -> list[ListenerChunk]:
        chunk, rid = copy.chunk, copy.chunk.request_id
        out: list[ListenerChunk] = []
        stream = self._open.get(rid) or self._ended.get(rid)
        if stream is not None and chunk.cache_epoch < stream.epoch:
            self._older_copy(chunk, copy.committed)
            return []
        if stream is None or chunk.cache_epoch > stream.epoch:
            if stream is not None and not stream.ended:
                if not copy.committed:  # its windows may still come: only committed order tells
                    self._hold_successor(stream, copy)
                    return []
                out += self._end(stream, "superseded", now)
                return out + self._replay(now) + self._fold(copy, now)
            if stream is not None:  # its digests stay, for copies that come late
                self._ended.pop(rid, None)
                stream.ended_at = now
                self._older[(rid, stream.epoch)] = stream
                while len(self._older) > self.config.max_ended:
                    self._older.popitem(last=False)
                self._forget_ended(now)
            stream = _Stream(rid, chunk.cache_epoch)
            self._open[rid] = stream
            out += self._enforce_cap(now)
        stream.heard_at = now
        out += self._window(stream, copy, now)
        return out

    def _hold_successor(self, stream: _Stream, copy: _Held) -> None:
        """A live copy of a newer epoch while `stream` is open: held until the stream ends (its
        final window played, or a committed copy of a newer epoch proves it over: an epoch's
        committed copies all come before the next epoch's), so that windows of it whose live
        copies were lost are still played from their committed copies; beyond `max_pending`
        the newest is set aside (its committed copy will play it)."""
        stream.successors.append(copy)
        if len(stream.successors) > self.config.max_pending:
            newest = max(
                stream.successors, key=lambda h: (h.chunk.cache_epoch, h.chunk.window_index)
            )
            stream.successors.remove(newest)
            self.stats.live_set_aside += 1

    def _replay(self, now: float) -> list[ListenerChunk]:
        """Fold the copies held for streams that have ended meanwhile, in arrival order."""
        out: list[ListenerChunk] = []
        while self._released:
            out += self._fold(self._released.popleft(), now)
        return out

    def expire(self, now: float) -> list[ListenerChunk]:
        """End the open streams no copy of any window came for in `idle_end_s` (`end ==
        "idle"`, what they hold delivered first); looks at most once a second."""
        if now - self._expired_at < 1.0:
            return []
        self._expired_at = now
        horizon = now - self.config.idle_end_s
        out: list[ListenerChunk] = []
        for stream in [s for s in self._open.values() if s.heard_at < horizon]:
            self.stats.idle_ended += 1
            out += self._end(stream, "idle", now)
        return out + self._replay(now)

    def close(self, now: float) -> list[ListenerChunk]:
        """End every open stream (`end == "closed"`), delivering what is held."""
        out: list[ListenerChunk] = []
        while self._open or self._released:
            for stream in list(self._open.values()):
                out += self._end(stream, "closed", now)
            out += self._replay(now)
        return out

    def _window(self, stream: _Stream, copy: _Held, now: float) -> list[ListenerChunk]:
        index = copy.chunk.window_index
        if index < stream.next_index or index in stream.pending:
            self._later_copy(stream, copy.chunk, copy.committed)
            held = index in stream.pending  # its committed copy may prove a gap before it
            return self._bound_pending(stream, now) if held else []
        if stream.ended:
            self.stats.after_final += 1
            return []
        stream.pending[index] = copy
        out = self._drain(stream, now)
        if stream.pending:
            out += self._bound_pending(stream, now)
        return out

    def _bound_pending(self, stream: _Stream, now: float) -> list[ListenerChunk]:
        """Windows held behind a gap: skip it once committed copies prove it (an epoch's
        committed copies come in window order, so a committed final, or more than
        `max_pending` committed copies, beyond it say its windows were never written), else
        wait for its committed copies, setting aside the newest live copies beyond
        `max_pending` (their committed copies will play them): a live copy is best effort, and
        one lost is no gap."""
        # `confirmed`: its committed copy has arrived (it is that copy, or that copy came for it)
        proven = [h for h in stream.pending.values() if h.confirmed]
        if len(proven) > self.config.max_pending or any(h.chunk.final for h in proven):
            return self._skip_gap(stream, now)
        while len(stream.pending) > self.config.max_pending:
            live = [i for i, h in stream.pending.items() if not h.confirmed]
            del stream.pending[max(live)]
            self.stats.live_set_aside += 1
        return []

    def _drain(self, stream: _Stream, now: float) -> list[ListenerChunk]:
        out = []
        while stream.next_index in stream.pending and not stream.ended:
            out.append(self._deliver(stream, stream.pending.pop(stream.next_index), now))
        return out

    def _skip_gap(self, stream: _Stream, now: float) -> list[ListenerChunk]:
        out: list[ListenerChunk] = []
        while stream.pending and not stream.ended:
            first = min(stream.pending)
            missing = first - stream.next_index
            stream.report.gap_windows += missing
            self.stats.gap_windows += missing
            log.warning("request %s epoch %d: windows %d..%d never arrived", stream.report.
                        request_id, stream.epoch, stream.next_index, first - 1)  # fmt: skip
            stream.next_index = first
            out += self._drain(stream, now)
        return out

    def _deliver(self, stream: _Stream, held: _Held, now: float) -> ListenerChunk:
        chunk, arrived = held.chunk, held.arrived
        report = stream.report
        gap = max(0, chunk.sample_offset - stream.next_sample) if stream.next_index > 0 else 0
        if stream.next_index == 0:
            gap = max(0, chunk.sample_offset)
        report.gap_samples += gap
        samples = len(chunk.pcm_s16le) // 2
        stream.next_index = chunk.window_index + 1
        stream.next_sample = chunk.sample_offset + samples
        report.windows += 1
        report.samples += samples
        if report.first_audio_latency_s is None and chunk.source_produced_at_ms > 0:
            report.first_audio_latency_s = max(0.0, arrived - chunk.source_produced_at_ms / 1000)
        if stream.last_at is not None:
            report.max_interval_s = max(report.max_interval_s, now - stream.last_at)
        stream.last_at = now
        self._remember(stream, chunk, held.confirmed)
        self.stats.delivered += 1
        if held.confirmed:
            report.confirmed += 1
            self.stats.confirmed += 1
        if chunk.final:
            report.end = "final"
            self._retire(stream, now)
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

    def _remember(self, stream: _Stream, chunk: AudioChunk, confirmed: bool) -> None:
        keep = self.config.keep_pcm > 0
        stream.seen[chunk.window_index] = _Seen(
            chunk.sha256, chunk.determinism_domain, chunk.pcm_s16le if keep else None, confirmed
        )
        if keep:
            stream.pcm_kept.append(chunk.window_index)
            while len(stream.pcm_kept) > self.config.keep_pcm:
                old = stream.seen.get(stream.pcm_kept.popleft())
                if old is not None:
                    old.pcm = None
        while len(stream.seen) > self.config.keep_digests:
            stream.seen.popitem(last=False)

    def _older_copy(self, chunk: AudioChunk, committed: bool) -> None:
        """A copy of an epoch its request has left: never played; it confirms (or duplicates)
        a window the older stream played (a committed copy can come after the live copy of
        the next epoch's first window), else it is stale."""
        older = self._older.get((chunk.request_id, chunk.cache_epoch))
        if older is not None and chunk.window_index in older.seen:
            self._later_copy(older, chunk, committed)
        else:
            self.stats.stale += 1

    def _later_copy(self, stream: _Stream, chunk: AudioChunk, committed: bool) -> None:
        held = stream.pending.get(chunk.window_index)
        if held is not None:
            first = _Seen(held.chunk.sha256, held.chunk.determinism_domain, held.chunk.pcm_s16le)
        else:
            found = stream.seen.get(chunk.window_index)
            if found is None:
                stream.report.uncompared += 1
                self.stats.uncompared += 1
                return
            first = found
        if first.sha256 == chunk.sha256:
            self._same(stream, held, first, committed)
            return
        same_domain = first.domain == chunk.determinism_domain and first.domain != ""
        if not same_domain and first.pcm is not None:
            verdict = compare_bound(first.pcm, chunk.pcm_s16le, self.config.bound)
            if verdict.ok:
                self.stats.differs_within_bound += 1
                self._same(stream, held, first, committed)
                return
        elif not same_domain:
            stream.report.uncompared += 1
            self.stats.uncompared += 1
            return
        stream.report.mismatches += 1
        self.stats.mismatches += 1
        log.warning(
            "request %s epoch %d window %d: a later copy differs (%s vs %s); the first was played",
            chunk.request_id,
            chunk.cache_epoch,
            chunk.window_index,
            first.domain or "unknown",
            chunk.determinism_domain or "unknown",
        )

    def _same(self, stream: _Stream, held: _Held | None, first: _Seen, committed: bool) -> None:
        """A later copy equal to the first: the committed one confirms it, others duplicate."""
        if held is not None and committed and not held.confirmed:
            held.confirmed = True  # counted when it is played
            return
        if held is None and committed and not first.confirmed:
            first.confirmed = True
            stream.report.confirmed += 1
            self.stats.confirmed += 1
            return
        stream.report.duplicates += 1
        self.stats.duplicates += 1

    def _end(self, stream: _Stream, reason: str, now: float) -> list[ListenerChunk]:
        out = self._skip_gap(stream, now)
        if stream.ended:
            return out
        stream.report.end = reason
        self._retire(stream, now)
        report = stream.report
        out.append(
            ListenerChunk(report.request_id, report.cache_epoch, stream.next_index,
                          stream.next_sample, 0, b"", False, reason, 0, now, 0, "")
        )  # fmt: skip
        return out

    def _retire(self, stream: _Stream, now: float) -> None:
        rid = stream.report.request_id
        stream.ended_at = now
        self._open.pop(rid, None)
        stream.pending.clear()
        self._released.extend(stream.successors)
        stream.successors.clear()
        for seen in stream.seen.values():
            seen.pcm = None
        stream.pcm_kept.clear()
        self._ended[rid] = stream
        self._ended.move_to_end(rid)
        self._finished.append(stream.report)
        while len(self._ended) > self.config.max_ended:
            self._ended.popitem(last=False)
        self._forget_ended(now)

    def _forget_ended(self, now: float) -> None:
        """Forget the streams that ended (or were replaced) more than `ended_ttl_s` ago: both
        LRUs are in that order. A listener of named requests keeps them."""
        if self.requests:
            return
        horizon = now - self.config.ended_ttl_s
        for remembered in (self._ended, self._older):
            while remembered and next(iter(remembered.values())).ended_at < horizon:
                remembered.popitem(last=False)

    def _enforce_cap(self, now: float) -> list[ListenerChunk]:
        out: list[ListenerChunk] = []
        while len(self._open) > self.config.max_open_streams:
            oldest = next(iter(self._open.values()))
            self.stats.evicted += 1
            out += self._end(oldest, "evicted", now)
        return out
