"""The listener on the real broker: speculative and committed listeners through SIGKILLs of the
consumer, aborted transactions seen by a read_uncommitted reader, and a listener started
mid-stream. The oracle is verify's offline replay of the chunk topic."""

from __future__ import annotations

import hashlib
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer

from codeclog.consumers.fold.machine import Policy
from codeclog.consumers.listener import AudioListener, Isolation, ListenerChunk
from codeclog.consumers.service import VocodeConfig, VocoderService
from codeclog.consumers.verify import actual_audio, expected_audio, verify
from codeclog.schemas import wire
from codeclog.schemas.records import AudioChunk

pytestmark = [pytest.mark.kafka]

Key = tuple[str, int, int]


class Follower(threading.Thread):
    """Runs a listener in the background, keeping every delivery, until told to catch up."""

    def __init__(self, listener: AudioListener) -> None:
        super().__init__(daemon=True)
        self.listener = listener
        self.delivered: list[ListenerChunk] = []
        self.finish = threading.Event()
        self.error: BaseException | None = None
        listener.start()

    def run(self) -> None:
        try:
            while True:
                self.delivered += self.listener.poll(0.1)
                if self.finish.is_set() and self.listener.caught_up():
                    self.delivered += self.listener.poll(0.5)  # what was fetched meanwhile
                    if self.listener.caught_up():
                        break
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.delivered += self.listener.close()

    def drain(self, timeout_s: float = 120.0) -> list[ListenerChunk]:
        self.finish.set()
        self.join(timeout_s)
        assert not self.is_alive(), "the listener did not catch up with the audio topic"
        assert self.error is None, self.error
        return self.delivered


def _windows(delivered: list[ListenerChunk]) -> dict[Key, list[bytes]]:
    seen: dict[Key, list[bytes]] = {}
    for item in delivered:
        if item.pcm:
            seen.setdefault((item.request_id, item.cache_epoch, item.window_index), []).append(
                item.pcm
            )
    return seen


def _replay(stack: Any, engine: Any) -> tuple[dict[Key, bytes], dict[str, bytes]]:
    """Every window of the offline replay (verify's oracle) and each request's whole PCM."""
    pipeline = expected_audio(stack.client, stack.topics, engine, Policy.TOLERANT, keep_pcm=True)
    windows: dict[Key, bytes] = {}
    whole: dict[str, bytes] = {}
    for rid, audio in pipeline.audio.items():
        pcm = bytes(audio.pcm or b"")
        whole[rid] = pcm
        start = 0
        for window in audio.windows:
            end = start + 2 * int(window["samples"])
            windows[(rid, window["cache_epoch"], window["window_index"])] = pcm[start:end]
            start = end
    return windows, whole


def _assembled(delivered: list[ListenerChunk], keep: Callable[[Key], bool]) -> dict[str, bytes]:
    out: dict[str, bytearray] = {}
    for item in delivered:
        key = (item.request_id, item.cache_epoch, item.window_index)
        if item.pcm and keep(key):
            out.setdefault(item.request_id, bytearray()).extend(item.pcm)
    return {rid: bytes(pcm) for rid, pcm in out.items()}


def _listener(stack: Any, isolation: Isolation) -> AudioListener:
    return AudioListener(stack.client, stack.topics.audio, isolation)


@pytest.mark.vocoder
@pytest.mark.slow
def test_listeners_through_sigkills_get_every_window_once_equal_to_the_replay(
    stack: Any, tiny_engine: Any
) -> None:
    speculative = Follower(_listener(stack, Isolation.SPECULATIVE))
    committed = Follower(_listener(stack, Isolation.COMMITTED))
    speculative.start()
    committed.start()
    stack.publish_sessions(sessions=6, seconds=6, seed=21)
    rng = random.Random(2222)
    for _ in range(3):
        process = stack.vocode("k", "--max-records", "8", idle_s=30)
        stack.wait_for_log(process, "state restored in", 120)
        time.sleep(rng.uniform(0.3, 3.0))  # inside a step, its transaction open, or between
        process.send_signal(signal.SIGKILL)
        process.wait()
    final = stack.vocode("k", "--max-records", "8", idle_s=4)
    assert final.wait(240) == 0, stack.logs()
    report = verify(stack.client, stack.topics, tiny_engine)
    assert report.ok, (report.to_dict(), stack.logs())
    expected, whole = _replay(stack, tiny_engine)
    assert len(expected) > 30
    for follower in (speculative, committed):
        delivered = follower.drain()
        windows = _windows(delivered)
        assert set(windows) == set(expected), follower.listener.isolation
        assert all(len(copies) == 1 for copies in windows.values()), "a window played twice"
        assert {k: v[0] for k, v in windows.items()} == expected
        assert _assembled(delivered, lambda key: True) == {r: p for r, p in whole.items() if p}
        stats = follower.listener.stats
        assert stats.mismatches == 0 and stats.corrupt == 0 and stats.gap_windows == 0
    assert committed.listener.stats.duplicates == 0  # the service writes each window once


def _audio_chunk(rid: str, index: int, pcm: bytes, final: bool = False) -> AudioChunk:
    return AudioChunk(
        request_id=rid,
        cache_epoch=0,
        chunk_seqs=(index,),
        window_index=index,
        sample_offset=index * len(pcm) // 2,
        sample_rate_hz=24000,
        pcm_s16le=pcm,
        sha256=hashlib.sha256(pcm).hexdigest(),
        final=final,
        determinism_domain="portable1:test",
    )


def test_an_aborted_transaction_plays_once_speculatively_and_never_committed(stack: Any) -> None:
    """A consumer writes windows 0 and 1 and dies before its commit (the transaction aborts); its
    successor re-decodes them identically and commits 0, 1, 2. A read_uncommitted listener
    plays the aborted copies at once and drops the committed ones as duplicates; a committed
    listener never sees the aborted copies. A replacement that differs is counted, not played."""
    speculative = _listener(stack, Isolation.SPECULATIVE)
    committed = _listener(stack, Isolation.COMMITTED)
    speculative.start()
    committed.start()
    pcm = [bytes([n]) * 1920 for n in (1, 2, 3)]
    producer = Producer({**stack.client, "transactional.id": f"{stack.group}-t"})
    producer.init_transactions(30)

    def write(chunks: list[AudioChunk], commit: bool) -> None:
        producer.begin_transaction()
        for c in chunks:
            producer.produce(stack.topics.audio, key=c.request_id.encode(), value=wire.encode(c))
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)

    write([_audio_chunk("a", 0, pcm[0]), _audio_chunk("a", 1, pcm[1])], commit=False)
    write([_audio_chunk("b", 0, pcm[0])], commit=False)
    write([_audio_chunk("a", i, pcm[i], final=i == 2) for i in range(3)], commit=True)
    write([_audio_chunk("b", 0, pcm[2], final=True)], commit=True)  # not the same bytes
    got: dict[Isolation, list[ListenerChunk]] = {}
    for listener in (speculative, committed):
        delivered: list[ListenerChunk] = []
        while not (listener.caught_up() and listener.assembler.ended("a")):
            delivered += listener.poll(0.2)
        delivered += listener.poll(0.5)
        listener.close()
        got[listener.isolation] = delivered
    for isolation, delivered in got.items():
        windows = _windows(delivered)
        assert windows[("a", 0, 0)] == [pcm[0]] and windows[("a", 0, 1)] == [pcm[1]]
        assert windows[("a", 0, 2)] == [pcm[2]], isolation
        assert len(windows[("b", 0, 0)]) == 1
    assert speculative.stats.duplicates == 2 and speculative.stats.mismatches == 1
    assert _windows(got[Isolation.SPECULATIVE])[("b", 0, 0)] == [pcm[0]]  # the first copy
    assert committed.stats.duplicates == 0 and committed.stats.mismatches == 0
    assert _windows(got[Isolation.COMMITTED])[("b", 0, 0)] == [pcm[2]]


@pytest.mark.vocoder
@pytest.mark.slow
def test_a_listener_started_mid_stream_catches_up_from_the_current_epoch(
    stack: Any, tiny_engine: Any
) -> None:
    from codeclog.producers.publisher import ChunkPublisher, PublisherConfig
    from codeclog.producers.synthetic import SyntheticConfig, merged, play, scripts
    from codeclog.producers.talker import Talker, wall_clock_ms

    steps = list(merged(scripts(SyntheticConfig(sessions=6, seconds=8, seed=31))))
    publisher = ChunkPublisher(
        stack.client, PublisherConfig(topic=stack.topics.chunks, producer_id="test-talker")
    )
    talker = Talker(publisher, producer_id="test-talker", native_duplex=True)

    def publish(part: list[Any]) -> None:
        play(part, talker.apply, total_s=8, realtime=False, clock=time.monotonic,
             sleep=time.sleep, now_ms=wall_clock_ms)  # fmt: skip
        assert publisher.flush(30) == 0

    def vocode() -> None:
        config = VocodeConfig(group=stack.group, exit_when_idle_s=4.0)
        assert VocoderService(stack.client, stack.topics, config, tiny_engine).run() == 0

    publish(steps[: len(steps) // 2])
    vocode()
    before, _ = actual_audio(stack.client, stack.topics)  # the audio topic when it starts
    current = {}
    for rid, epoch, _ in before:
        current[rid] = max(current.get(rid, -1), epoch)
    follower = Follower(_listener(stack, Isolation.SPECULATIVE))
    follower.start()
    publish(steps[len(steps) // 2 :])
    publisher.close(30)
    vocode()
    delivered = follower.drain()
    expected, _ = _replay(stack, tiny_engine)

    def wanted(key: Key) -> bool:  # the current epoch at start, and everything after it
        return key[1] >= current.get(key[0], -1)

    windows = _windows(delivered)
    assert set(windows) == {key for key in expected if wanted(key)}
    assert {k: v[0] for k, v in windows.items()} == {k: v for k, v in expected.items() if wanted(k)}
    # it was mid-stream: some current epoch had windows written both before and after the start
    after = {(rid, epoch) for rid, epoch, _ in set(expected) - set(before)}
    assert any((rid, epoch) in after for rid, epoch in current.items())
    assert any(key[1] < current.get(key[0], -1) for key in expected), "no older epoch to skip"
    assert follower.listener.stats.skipped_old_epoch > 0
