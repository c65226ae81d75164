"""The listener on the real broker: speculative and committed listeners through SIGKILLs of the
consumer and a fenced member, live copies of aborted transactions, and a listener started
mid-stream. The oracle is verify's offline replay of the chunk topic."""

from __future__ import annotations

import hashlib
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from codeclog.consumers.member.metrics import VocoderMetrics
from codeclog.consumers.member.service import VocodeConfig, VocoderService
from codeclog.consumers.member.transaction import Transactions
from codeclog.consumers.readers.assembler import ListenerChunk
from codeclog.consumers.readers.listener import AudioListener, Isolation
from codeclog.consumers.readers.verify import actual_audio, expected_audio
from codeclog.consumers.stream.fold.state import Policy
from codeclog.kafka.calls import InfrastructureError
from codeclog.schemas import wire
from codeclog.schemas.records import AudioChunk
from tests.consumer.audio_ends import audio_ends, windows_on
from tests.consumer.conftest import LiveTalker

pytestmark = [pytest.mark.kafka]

Key = tuple[str, int, int]


def _keys(delivered: list[ListenerChunk]) -> set[Key]:
    """The windows played (not the ends of streams)."""
    return {(c.request_id, c.cache_epoch, c.window_index) for c in delivered if c.pcm}


def _live_only(delivered: list[ListenerChunk]) -> set[Key]:
    """The windows played from their live copies."""
    return _keys([c for c in delivered if not c.committed])


def _playable(windows: set[Key], waiting: dict[str, int]) -> set[Key]:
    """The windows a speculative listener plays from their live copies alone: not those of a
    newer epoch than one it holds open (after a barge-in they wait for their committed copies,
    docs/listening.md; `Assembler.waiting_on_older_epochs`)."""
    return {(r, e, i) for r, e, i in windows if e <= waiting.get(r, e)}


class Follower(threading.Thread):
    """Runs a listener in the background, keeping every delivery, until told to catch up.
    Only this thread touches the listener (position() from another thread while this one is
    in consume() was seen to block for good): other threads ask through events."""

    def __init__(self, listener: AudioListener) -> None:
        super().__init__(daemon=True)
        self.listener = listener
        self.delivered: list[ListenerChunk] = []
        self.finish = threading.Event()
        self.error: BaseException | None = None
        self.waiting: dict[str, int] = {}  # the assembler's waiting_on_older_epochs(), each poll
        listener.start()

    def run(self) -> None:
        try:
            while True:
                self.delivered += self.listener.poll(0.1)
                self.waiting = self.listener.assembler.waiting_on_older_epochs()
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
        stats = self.listener.stats
        assert not self.is_alive(), f"the listener did not catch up in {timeout_s:.0f} s: {stats}"
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
    pipeline, _ = expected_audio(stack.client, stack.topics, engine, Policy.TOLERANT, keep_pcm=True)
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


class Budget:
    """One deadline for every wait of a test (below pytest's timeout), failing with the logs."""

    def __init__(self, stack: Any, seconds: float) -> None:
        self.stack = stack
        self.deadline = time.monotonic() + seconds

    def wait(self, what: str, condition: Callable[[], bool], process: Any = None) -> None:
        while not condition():
            self.check(what, process)
            time.sleep(0.05)

    def check(self, what: str, process: Any = None) -> None:
        """Fails if `process` has exited or the budget is spent."""
        if process is not None and process.poll() is not None:
            raise AssertionError(f"exited ({process.returncode}) before {what}")
        if time.monotonic() > self.deadline:
            raise AssertionError(f"budget spent waiting for {what}:\n{self.stack.logs()}")

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 1.0)

    def mark(self, what: str) -> None:  # shown with a failure: where the time went
        print(f"{self.left():.0f} s of the budget left: {what}", flush=True)


def _open_audio_transaction(stack: Any, admin: AdminClient) -> bool:
    """Some audio partition holds records of an open transaction: its last stable offset is
    below its high watermark (read first, so records arriving in between are not counted)."""
    stable, high = audio_ends(stack, admin)
    return any(stable[p] < high[p] for p in high)


@pytest.mark.vocoder
@pytest.mark.slow
# Long: 64-67 s on a quiet machine; the quick run keeps the abort and the fence below
# (test_a_live_copy_of_an_aborted_transaction_plays_once_and_the_commit_confirms_it,
# test_a_member_fenced_after_its_audio_went_out_live_is_replaced_by_the_same_bytes).
@pytest.mark.long
@pytest.mark.timeout(480)  # the budget below leaves room for a loaded machine
def test_listeners_through_sigkills_get_every_window_once_equal_to_the_replay(
    stack: Any, tiny_engine: Any
) -> None:
    """Two SIGKILLs of the consumer: one at a random point after its recovery, one frozen
    (SIGSTOP) as its live copies appear, before their step commits (inside its open audio
    transaction, or before it began), once the speculative listener has played the live copies
    of windows the committed copy does not hold yet (all but a barge-in's new epoch, which waits
    for its committed copy), so that listener certainly played windows of a step that then
    never committed. Both listeners then hold every window of verify's replay exactly once,
    with its bytes, and every window the speculative one played is confirmed by its committed
    copy."""
    speculative = Follower(_listener(stack, Isolation.SPECULATIVE))
    committed = Follower(_listener(stack, Isolation.COMMITTED))
    speculative.start()
    committed.start()
    stack.publish_sessions(sessions=6, seconds=6, seed=21)
    budget = Budget(stack, 380)  # pytest's 480 s include the broker's start
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    rng = random.Random(2222)

    def restored(process: Any) -> Callable[[], bool]:
        return lambda: "state restored in" in stack.log_of[process.pid].read_text()

    first = stack.vocode("k", "--max-records", "8", idle_s=30)  # small steps: many commits
    budget.wait("state restored", restored(first), first)
    time.sleep(rng.uniform(0.3, 3.0))  # inside a step, its transaction open, or between
    first.send_signal(signal.SIGKILL)
    first.wait()
    budget.mark("first consumer killed")
    second = stack.vocode("k", "--max-records", "8", idle_s=30)  # fences the first's leftover
    budget.wait("state restored", restored(second), second)
    # Fresh work for the freeze below, spoken in real time so that steps (and their open
    # transactions) keep coming while the loop below tries to catch one: a batch published at
    # once is decoded in a few fast steps on an idle machine, and the member then idles out.
    live = LiveTalker(stack, sessions=6, seconds=12, seed=22)

    def heard() -> set[Key]:
        return _keys(speculative.delivered)

    def played(windows: set[Key]) -> Callable[[], bool]:
        return lambda: _playable(windows, speculative.waiting) <= heard()

    # Freeze it as a new live copy appears, so that it stops after some of its windows went out
    # live and before their step committed: inside the step's open transaction, or before it
    # began (at a random moment the odds are a few percent: on an idle machine a step commits
    # within ms of its live copies). The member then dies, so that step never commits: the final
    # member decodes it again.
    watch = Consumer({**stack.client, "group.id": "watch", "fetch.wait.max.ms": 5})
    watch.assign([TopicPartition(stack.topics.live, p, OFFSET_END)
                  for p in range(stack.topics.partitions)])  # fmt: skip
    tries = 0
    try:
        while True:
            budget.check("live copies ahead of the committed audio", second)
            if not [m for m in watch.consume(1, 0.1) if m.error() is None]:
                continue
            second.send_signal(signal.SIGSTOP)
            tries += 1
            time.sleep(0.5)  # a commit already sent lands now: then this is not open work
            if _live_only(speculative.delivered) - _keys(committed.delivered):  # worth a look
                in_transaction = _open_audio_transaction(stack, admin)
                live_copies = windows_on(stack, stack.topics.live)
                uncommitted = live_copies - windows_on(stack, stack.topics.audio)
                try:
                    budget.wait("the speculative listener playing the live copies",
                                played(uncommitted))  # fmt: skip
                except AssertionError as exc:
                    missing = sorted(_playable(uncommitted, speculative.waiting) - heard())
                    held = speculative.waiting
                    stats = speculative.listener.stats
                    raise AssertionError(
                        f"{exc}\nnot played: {missing[:8]}; waiting on older epochs: {held}; "
                        f"{stats}"
                    ) from None
                if uncommitted & heard():  # else all of a barge-in's new epoch: try again
                    break
            watch.consume(10_000, 0)  # what came meanwhile
            second.send_signal(signal.SIGCONT)
    finally:
        watch.close()
    where = "inside an open transaction" if in_transaction else "before its step's transaction"
    budget.mark(f"second consumer frozen {where} ({tries} tries), its live copies played")
    second.send_signal(signal.SIGKILL)
    second.wait()
    budget.mark("second consumer killed")
    live.join(budget.left())
    assert live.delivered_everything, stack.logs()
    final = stack.vocode("k", "--max-records", "8", idle_s=4)
    try:
        assert final.wait(budget.left()) == 0, stack.logs()
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the last consumer did not finish:\n{stack.logs()}") from None
    budget.mark("the last consumer finished")
    expected, whole = _replay(stack, tiny_engine)  # verify's oracle (verify itself: other tests)
    assert len(expected) > 30
    budget.mark("verified")
    for follower in (speculative, committed):
        delivered = follower.drain(budget.left())
        windows = _windows(delivered)
        assert set(windows) == set(expected), follower.listener.isolation
        assert all(len(copies) == 1 for copies in windows.values()), "a window played twice"
        assert {k: v[0] for k, v in windows.items()} == expected
        assert _assembled(delivered, lambda key: True) == {r: p for r, p in whole.items() if p}
        stats = follower.listener.stats
        assert stats.mismatches == 0 and stats.corrupt == 0 and stats.gap_windows == 0
    assert speculative.listener.stats.duplicates > 0  # it played windows of an aborted step
    assert uncommitted <= set(expected)  # the committed copy ends up holding what was heard
    for follower in (speculative, committed):
        assert follower.listener.stats.confirmed == len(expected)
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


def test_a_live_copy_of_an_aborted_transaction_plays_once_and_the_commit_confirms_it(
    stack: Any,
) -> None:
    """As a member does: windows 0 and 1 of "a" written live, then in a transaction that
    aborts (the member died); its successor re-decodes them identically, writes them live again
    and commits 0, 1, 2. A speculative listener plays the first live copies at once, counts the
    re-decode's live copies as duplicates and the committed copies as confirmations; a
    committed listener never sees a live copy. A replacement that differs ("b") is counted, not
    played."""
    speculative = _listener(stack, Isolation.SPECULATIVE)
    committed = _listener(stack, Isolation.COMMITTED)
    speculative.start()
    committed.start()
    pcm = [bytes([n]) * 1920 for n in (1, 2, 3)]
    producer = Producer({**stack.client, "transactional.id": f"{stack.group}-t"})
    producer.init_transactions(30)
    live = Producer({**stack.client, "enable.idempotence": True})

    def write(chunks: list[AudioChunk], commit: bool) -> None:
        for c in chunks:  # the live copy first, outside the transaction
            live.produce(stack.topics.live, key=c.request_id.encode(), value=wire.encode(c))
        assert live.flush(30) == 0
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
    first = {(c.request_id, c.window_index): c.committed for c in got[Isolation.SPECULATIVE]}
    assert first[("a", 0)] is False and first[("a", 1)] is False  # heard before any commit
    stats = speculative.stats
    assert stats.confirmed == 3 and stats.duplicates == 2 and stats.mismatches == 2
    assert _windows(got[Isolation.SPECULATIVE])[("b", 0, 0)] == [pcm[0]]  # the first copy
    assert committed.stats.duplicates == 0 and committed.stats.mismatches == 0
    assert committed.stats.confirmed == committed.stats.delivered == 4
    assert _windows(got[Isolation.COMMITTED])[("b", 0, 0)] == [pcm[2]]


class FencedOnce(Transactions):
    """The member's transactions, fenced at the first one that carries audio: a successor with
    the same transactional id calls init_transactions (as `codeclog vocode` with the same
    --instance-id does at its start) after the step's live copies went out, before its commit.
    What that transaction carried is on the live topic and never committed."""

    successor: Any = None
    audio_topic = ""

    def _write_transaction(self, steps: Any) -> None:
        audio = [w for step in steps for w in step.records if w.topic == self.audio_topic]
        if audio and self.successor is None:
            self.successor = Producer(
                {**self.producer_config, "transactional.id": self.transactional_id}
            )
            self.successor.init_transactions(30)  # bumps the epoch: this producer is stale
        super()._write_transaction(steps)


@pytest.mark.vocoder
@pytest.mark.slow
def test_a_member_fenced_after_its_audio_went_out_live_is_replaced_by_the_same_bytes(
    stack: Any, tiny_engine: Any
) -> None:
    """A member's producer epoch is rejected (fenced) after the windows of its open transaction
    were written live and heard: the member ends (exit 1 on the command line), its successor
    decodes the same steps again from the committed offsets and commits them. The speculative
    listener heard each of those windows once, before any commit, with the bytes the committed
    copy ends up holding (verify's replay), and every window it played is confirmed."""
    speculative = Follower(_listener(stack, Isolation.SPECULATIVE))
    committed = Follower(_listener(stack, Isolation.COMMITTED))
    speculative.start()
    committed.start()
    stack.publish_sessions(sessions=4, seconds=4, seed=42)
    config = VocodeConfig(group=stack.group, instance_id="f", max_records=8, exit_when_idle_s=3)
    fenced = FencedOnce(
        stack.client, config.transactional_id, 60_000, 10.0, VocoderMetrics.create(None)
    )
    fenced.audio_topic = stack.topics.audio
    first = VocoderService(stack.client, stack.topics, config, tiny_engine, transactions=fenced)
    with pytest.raises(InfrastructureError, match="fenced"):
        first.run()
    heard_live = windows_on(stack, stack.topics.live) - windows_on(stack, stack.topics.audio)
    assert heard_live, "no window of the fenced transaction went out live"
    VocoderService(stack.client, stack.topics, config, tiny_engine).run()  # the successor
    fenced.successor.flush(10)
    expected, _ = _replay(stack, tiny_engine)
    for follower in (speculative, committed):
        windows = _windows(follower.drain())
        assert set(windows) == set(expected), follower.listener.isolation
        assert all(len(copies) == 1 for copies in windows.values()), "a window played twice"
        assert {k: v[0] for k, v in windows.items()} == expected
        stats = follower.listener.stats
        assert stats.mismatches == stats.corrupt == stats.gap_windows == 0
        assert stats.confirmed == stats.delivered == len(expected)
    assert heard_live <= set(expected)  # the committed copy holds what was heard live
    heard_first = {
        (c.request_id, c.cache_epoch, c.window_index): c.committed for c in speculative.delivered
    }
    assert not any(heard_first[key] for key in heard_live)  # heard before any commit
    assert speculative.listener.stats.duplicates >= len(heard_live)  # the successor's copies
    assert committed.listener.stats.duplicates == 0
    assert any(epoch > 0 for _, epoch, _ in expected)  # a barge-in: an epoch ended, a new one


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
        VocoderService(stack.client, stack.topics, config, tiny_engine).run()

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


def _cli(stack: Any, *args: str) -> list[str]:
    import sys

    common = ["--bootstrap", stack.bootstrap, "--topics-config", str(stack.topics_file)]
    return [sys.executable, "-m", "codeclog.cli", *args, *common]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_listen_stops_cleanly_on_sigterm_and_on_a_sigint_it_inherited_ignored(
    stack: Any, tmp_path: Any, sig: signal.Signals
) -> None:
    """A supervisor stops `codeclog listen` with SIGTERM; a shell without job control starts a
    background job with SIGINT ignored (so Python installs no KeyboardInterrupt). Either way the
    listener ends its streams, prints its summary and exits 0 (the soak's listeners, started
    that way, ignored SIGINT and were SIGKILLed a minute later)."""
    err = tmp_path / "listen.err"
    with err.open("wb") as sink:
        listener = subprocess.Popen(
            _cli(stack, "listen", "--out", str(tmp_path / "wav")),
            stdout=subprocess.PIPE, stderr=sink,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "[listen]" not in err.read_text(errors="replace"):
            assert listener.poll() is None, err.read_text(errors="replace")
            assert time.monotonic() < deadline, "the listener never started"
            time.sleep(0.2)
        listener.send_signal(sig)
        out, _ = listener.communicate(timeout=30)
    finally:
        listener.kill()
    assert listener.returncode == 0, err.read_text(errors="replace")
    assert err.read_text().endswith("\n")  # the last progress line, then the summary
    assert out == b""  # no stream was open: nothing to summarise


def _per_epoch(expected: dict[Key, bytes]) -> dict[tuple[str, int], bytes]:
    out: dict[tuple[str, int], bytearray] = {}
    for (rid, epoch, _), pcm in sorted(expected.items()):  # window order within each epoch
        out.setdefault((rid, epoch), bytearray()).extend(pcm)
    return {key: bytes(pcm) for key, pcm in out.items()}


@pytest.mark.vocoder
@pytest.mark.slow
def test_the_listen_command_end_to_end_talk_vocode_listen(
    stack: Any, tiny_engine: Any, tmp_path: Any
) -> None:
    """`codeclog talk`, `codeclog vocode`, then `codeclog listen`: live on --stdout for one
    request (speculative, started while the vocoder works), and afterwards --out with
    --from-beginning (committed); both equal verify's offline replay."""
    import wave

    talk = subprocess.run(
        _cli(stack, "talk", "--sessions", "3", "--seconds", "6", "--seed", "4", "--quiet"),
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert talk.returncode == 0, talk.stderr.decode()
    vocode = stack.vocode("l", idle_s=3)
    stack.wait_for_log(vocode, "state restored in", 120)
    live = subprocess.Popen(
        _cli(stack, "listen", "--request", "s4-0001", "--stdout", "--exit-when-idle", "8"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        pcm, live_err = live.communicate(timeout=200)
    finally:
        live.kill()
    assert live.returncode == 0, live_err.decode()
    assert vocode.wait(120) == 0, stack.logs()
    out = tmp_path / "wav"
    after = subprocess.run(
        _cli(stack, "listen", "--isolation", "committed", "--from-beginning", "--out", str(out),
             "--exit-when-idle", "1"),
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert after.returncode == 0, after.stderr.decode()
    expected = _per_epoch(_replay(stack, tiny_engine)[0])
    assert len(expected) >= 4
    wavs = {}
    for path in out.glob("*.wav"):
        rid, epoch = path.stem.rsplit(".e", 1)
        with wave.open(str(path), "rb") as wav:
            assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24000)
            wavs[(rid, int(epoch))] = wav.readframes(wav.getnframes())
    assert wavs == expected
    summary = [line for line in after.stdout.decode().splitlines() if " epoch " in line]
    assert len(summary) == len(expected), after.stdout.decode()
    assert " epoch " in live_err.decode()  # with --stdout the summary goes to stderr
    # live: from the request's current epoch when it started, every later epoch in order
    epochs = sorted(e for rid, e in expected if rid == "s4-0001")
    tails = [b"".join(expected[("s4-0001", e)] for e in epochs if e >= first) for first in epochs]
    assert pcm and pcm in tails, (len(pcm), [len(t) for t in tails], live_err.decode()[-500:])


def test_memory_stays_bounded_with_a_thousand_concurrent_requests_on_the_broker(
    stack: Any,
) -> None:
    """1,000 requests whose windows interleave on the audio topic (each window once, plus a
    later copy of a tenth of them, as after an abort): a speculative listener with the default
    bounds never holds more than its bound, plays each window once, and ends every stream."""
    requests, windows, samples = 1000, 4, 960
    rng = random.Random(22)
    producer = Producer({**stack.client, "enable.idempotence": True, "linger.ms": 5})
    for index in range(windows):
        row = [f"m{n:04d}" for n in range(requests)]
        rng.shuffle(row)
        for rid in [*row, *rng.sample(row, requests // 10)]:
            pcm = hashlib.sha256(f"{rid}/{index}".encode()).digest() * (2 * samples // 32)
            chunk = _audio_chunk(rid, index, pcm, final=index == windows - 1)
            producer.produce(stack.topics.audio, key=rid.encode(), value=wire.encode(chunk))
        producer.poll(0)
    assert producer.flush(60) == 0
    listener = AudioListener(stack.client, stack.topics.audio, Isolation.SPECULATIVE)
    bound = listener.assembler.max_buffered_bytes(2 * samples)
    played: dict[tuple[str, int], int] = {}
    worst_bytes = worst_open = 0
    deadline = time.monotonic() + 120
    while not (listener.caught_up() and listener.assembler.open_streams() == 0):
        assert time.monotonic() < deadline, f"not caught up after 120 s: {listener.stats}"
        for item in listener.poll(0.2):
            if item.pcm:
                key = (item.request_id, item.window_index)
                played[key] = played.get(key, 0) + 1
        worst_bytes = max(worst_bytes, listener.assembler.buffered_bytes())
        worst_open = max(worst_open, listener.assembler.open_streams())
    listener.close()
    assert worst_bytes <= bound and worst_open <= listener.assembler.config.max_open_streams
    assert len(played) == requests * windows and set(played.values()) == {1}
    stats = listener.stats
    assert stats.duplicates == windows * (requests // 10) and stats.mismatches == 0
    assert listener.assembler.buffered_bytes() == 0 and stats.evicted == 0
    assert listener.assembler.remembered_streams() == requests  # digests only, bounded LRU
