"""The pure listener: decoded AudioChunks in, ordered de-duplicated deliveries out, memory bounded.
Reasons: docs/listening.md; consumers/readers/listener.py feeds it from Kafka."""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable

from codeclog.consumers.readers.audio_compare import pcm_digest
from codeclog.consumers.readers.deliveries import (
    ListenerChunk,
    ListenerConfig,
    ListenerStats,
    StreamReport,
)
from codeclog.consumers.readers.epoch_stream import EpochStream, Held
from codeclog.schemas.records import AudioChunk

log = logging.getLogger("codeclog.listen")


class Assembler:
    """The pure listener: decoded audio chunks in, ordered de-duplicated deliveries out. It
    keeps the streams, each an `EpochStream`, within ListenerConfig's bounds: at most
    `max_open_streams` open (the least recently opened is ended `evicted` beyond it); per stream
    `max_pending` windows held out of order and `max_pending` live copies of a newer epoch held
    until it ends, the PCM of the last `keep_pcm` delivered windows and the digests of the last
    `keep_digests`; ended streams keep their digests only, in an LRU of `max_ended` (each
    request's newest epoch) and another of `max_ended` (epochs a newer one replaced), each for
    `ended_ttl_s` after it ended or was replaced (a listener of named requests keeps its few for
    good); an open stream no copy of any window came for in `idle_end_s` is ended
    (`end == "idle"`, `expire`). Why: docs/listening.md."""

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
        self._open: collections.OrderedDict[str, EpochStream] = collections.OrderedDict()
        self._ended: collections.OrderedDict[str, EpochStream] = collections.OrderedDict()
        # streams a newer epoch of their request replaced (digests only), by (request, epoch)
        self._older: collections.OrderedDict[tuple[str, int], EpochStream] = (
            collections.OrderedDict()
        )
        # every ended stream's report, superseded epochs included (_ended keeps one per request)
        self._finished: collections.deque[StreamReport] = collections.deque(
            maxlen=self.config.max_ended
        )
        self._expired_at = 0.0  # listener clock: the last look for idle streams
        # copies held for a stream that has ended since: folded next (`_replay`)
        self._released: collections.deque[Held] = collections.deque()

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
        copy = Held(chunk, now, written_at_ms, committed, committed)
        return self._fold(copy, now) + self._replay(now)

    def _fold(self, copy: Held, now: float) -> list[ListenerChunk]:
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
            stream = EpochStream(rid, chunk.cache_epoch, self.config, self.stats, self._retire)
            self._open[rid] = stream
            out += self._enforce_cap(now)
        stream.heard_at = now
        out += stream.window(copy, now)
        return out

    def _hold_successor(self, stream: EpochStream, copy: Held) -> None:
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

    def _older_copy(self, chunk: AudioChunk, committed: bool) -> None:
        """A copy of an epoch its request has left: never played; it confirms (or duplicates)
        a window the older stream played (a committed copy can come after the live copy of
        the next epoch's first window), else it is stale."""
        older = self._older.get((chunk.request_id, chunk.cache_epoch))
        if older is not None and chunk.window_index in older.seen:
            older.later_copy(chunk, committed)
        else:
            self.stats.stale += 1

    def _end(self, stream: EpochStream, reason: str, now: float) -> list[ListenerChunk]:
        out = stream.skip_gap(now)
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

    def _retire(self, stream: EpochStream, now: float) -> None:
        rid = stream.report.request_id
        stream.ended_at = now
        self._open.pop(rid, None)
        self._released.extend(stream.release())
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
