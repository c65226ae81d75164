"""The listener's assembly rules, without a broker: order, first copy wins, comparison of later
copies, gaps, epochs, and bounded memory with 1,000 concurrent requests (a fake consumer)."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from codeclog.consumers.readers.assembler import Assembler, ListenerChunk, ListenerConfig
from codeclog.consumers.readers.listener import AudioListener, Isolation, StartMode
from codeclog.schemas import wire
from codeclog.schemas.records import AudioChunk
from tests.fake_kafka import FakeMessage

WINDOW = 960  # samples per test window


def chunk(
    rid: str,
    index: int,
    epoch: int = 0,
    final: bool = False,
    domain: str = "d1",
    pcm: bytes | None = None,
    samples: int = WINDOW,
) -> AudioChunk:
    if pcm is None:
        rng = np.random.default_rng(abs(hash((rid, epoch, index))) % 2**32)
        pcm = rng.integers(-3000, 3000, samples, dtype="<i2").tobytes()
    return AudioChunk(
        request_id=rid,
        cache_epoch=epoch,
        chunk_seqs=(index,),
        window_index=index,
        sample_offset=index * samples,
        sample_rate_hz=24000,
        pcm_s16le=pcm,
        sha256=hashlib.sha256(pcm).hexdigest(),
        final=final,
        source_produced_at_ms=1000,
        determinism_domain=domain,
    )


def audio(out: list[ListenerChunk]) -> list[tuple[str, int, int]]:
    return [(c.request_id, c.cache_epoch, c.window_index) for c in out if c.pcm]


def test_windows_come_in_order_and_the_final_one_ends_the_stream() -> None:
    a = Assembler()
    out = a.offer(chunk("r", 0), 1.5) + a.offer(chunk("r", 1), 2.0)
    out += a.offer(chunk("r", 2, final=True), 2.5)
    assert audio(out) == [("r", 0, 0), ("r", 0, 1), ("r", 0, 2)]
    assert [c.end for c in out] == [None, None, "final"]
    report = a.ended("r")
    assert report is not None and report.windows == 3 and report.samples == 3 * WINDOW
    assert report.first_audio_latency_s == 0.5 and report.max_interval_s == 0.5
    assert a.open_streams() == 0


def test_first_copy_wins_and_identical_later_copies_are_dropped() -> None:
    a = Assembler()
    first = a.offer(chunk("r", 0), 1.0) + a.offer(chunk("r", 1), 1.0)
    again = a.offer(chunk("r", 0), 2.0) + a.offer(chunk("r", 1), 2.0)
    assert audio(first) == [("r", 0, 0), ("r", 0, 1)] and again == []
    assert a.stats.duplicates == 2 and a.stats.mismatches == 0


def test_the_live_copy_plays_and_its_committed_copy_confirms_it() -> None:
    """Speculative: the live copy (committed=False) is played at once; the committed copy that
    follows confirms it and is not a duplicate; a re-decoded live copy is one."""
    a = Assembler()
    played = a.offer(chunk("r", 0), 1.0, committed=False)
    assert audio(played) == [("r", 0, 0)] and not played[0].committed
    assert a.stats.confirmed == 0
    assert a.offer(chunk("r", 0), 1.2, committed=True) == []
    assert a.stats.confirmed == 1 and a.stats.duplicates == 0
    assert a.offer(chunk("r", 0), 1.5, committed=False) == []  # a re-decode's live copy
    assert a.offer(chunk("r", 0), 1.6, committed=True) == []  # read twice: not confirmed twice
    assert a.stats.duplicates == 2 and a.stats.confirmed == 1 and a.stats.delivered == 1


def test_a_committed_copy_that_comes_first_plays_confirmed() -> None:
    """The live copy was lost (or is late): the committed one plays, already confirmed."""
    a = Assembler()
    played = a.offer(chunk("r", 0), 1.0, committed=True)
    assert audio(played) == [("r", 0, 0)] and played[0].committed
    assert a.offer(chunk("r", 0), 1.1, committed=False) == []
    assert a.stats.confirmed == 1 and a.stats.duplicates == 1


def test_a_held_window_confirmed_before_it_plays_counts_once() -> None:
    a = Assembler()
    assert a.offer(chunk("r", 1), 1.0, committed=False) == []  # held: window 0 is missing
    assert a.offer(chunk("r", 1), 1.1, committed=True) == []  # its committed copy
    out = a.offer(chunk("r", 0), 1.2, committed=False)
    assert audio(out) == [("r", 0, 0), ("r", 0, 1)]
    assert [c.committed for c in out] == [False, False]  # the live bytes played
    report = a.reports()[0]
    assert a.stats.confirmed == 1 and report.confirmed == 1 and a.stats.duplicates == 0


def test_a_newer_epochs_live_copy_waits_until_committed_copies_close_the_older_one() -> None:
    """The live topic runs a transaction ahead: the live copy of a barge-in's new epoch can
    come before the committed copies of the old epoch's last windows, and their own live copies
    can be lost (soak run 4: a listener that switched at the new epoch's live copy missed 11
    windows of the old one, their committed copies dropped as stale). The new epoch is held
    until committed copies close the old one: it plays what the committed listener plays."""
    a = Assembler()
    out = a.offer(chunk("r", 0, epoch=0), 1.0, committed=False)
    out += a.offer(chunk("r", 0, epoch=1), 1.1, committed=False)  # held: epoch 0 is open
    assert a.waiting_on_older_epochs() == {"r": 0}
    out += a.offer(chunk("r", 0, epoch=0), 1.2, committed=True)  # confirms window 0
    out += a.offer(chunk("r", 1, epoch=0), 1.3, committed=True)  # its live copy was lost
    assert audio(out) == [("r", 0, 0), ("r", 0, 1)] and a.stats.confirmed == 2
    out = a.offer(chunk("r", 0, epoch=1), 1.4, committed=True)  # epoch 0 has no more windows
    assert [(c.cache_epoch, c.window_index, c.end, bool(c.pcm)) for c in out] == [
        (0, 2, "superseded", False),
        (1, 0, None, True),
    ]
    assert a.waiting_on_older_epochs() == {}
    assert not out[-1].committed  # the live copy played, its committed copy confirmed it
    assert a.stats.confirmed == 3 and a.stats.stale == 0 and a.stats.duplicates == 0


def test_a_newer_epochs_live_copies_play_right_after_the_older_epochs_final_window() -> None:
    a = Assembler()
    out = a.offer(chunk("r", 0, epoch=0), 1.0, committed=False)
    out += a.offer(chunk("r", 0, epoch=1), 1.1, committed=False)  # epoch 0's live 1, 2 lost
    out += a.offer(chunk("r", 1, epoch=1), 1.15, committed=False)
    for index in range(3):
        out += a.offer(chunk("r", index, 0, index == 2), 1.2 + index / 10, committed=True)
    assert audio(out) == [("r", 0, 0), ("r", 0, 1), ("r", 0, 2), ("r", 1, 0), ("r", 1, 1)]
    older = [r for r in a.reports() if r.cache_epoch == 0]
    assert older[0].end == "final" and older[0].windows == 3 and older[0].gap_windows == 0


def test_live_copies_of_a_newer_epoch_held_stay_within_max_pending() -> None:
    a = Assembler(ListenerConfig(max_pending=2))
    a.offer(chunk("r", 0, epoch=0), 1.0, committed=False)
    for index in range(5):
        assert a.offer(chunk("r", index, epoch=1), 1.1, committed=False) == []
    assert a.stats.live_set_aside == 3
    assert a.buffered_bytes() <= a.max_buffered_bytes(2 * WINDOW)
    out = a.offer(chunk("r", 0, epoch=0), 1.2, committed=True)
    out += a.offer(chunk("r", 1, epoch=0, final=True), 1.3, committed=True)
    assert audio(out) == [("r", 0, 1), ("r", 1, 0), ("r", 1, 1)]  # the rest from committed


def test_a_committed_copy_that_differs_from_the_live_one_played_is_a_mismatch() -> None:
    a = Assembler()
    a.offer(chunk("r", 0), 1.0, committed=False)
    assert a.offer(chunk("r", 0, pcm=bytes(2 * WINDOW)), 2.0, committed=True) == []
    assert a.stats.mismatches == 1 and a.stats.confirmed == 0


def test_a_different_later_copy_in_the_same_domain_is_a_mismatch_never_played() -> None:
    a = Assembler()
    a.offer(chunk("r", 0), 1.0)
    other = bytes(2 * WINDOW)
    assert a.offer(chunk("r", 0, pcm=other), 2.0) == []
    assert a.stats.mismatches == 1 and a.stats.duplicates == 0


def test_across_domains_later_copies_are_judged_by_the_bound() -> None:
    a = Assembler()
    original = chunk("r", 0, domain="native:a")
    a.offer(original, 1.0)
    samples = np.frombuffer(original.pcm_s16le, dtype="<i2").astype(np.int32)
    near = (samples + 1).astype("<i2").tobytes()  # 1 LSB everywhere: rounding noise
    far = (samples + 900).astype("<i2").tobytes()
    assert a.offer(chunk("r", 0, domain="native:b", pcm=near), 2.0) == []
    assert a.stats.differs_within_bound == 1 and a.stats.mismatches == 0
    assert a.offer(chunk("r", 0, domain="native:b", pcm=far), 2.0) == []
    assert a.stats.mismatches == 1 and a.stats.delivered == 1


def test_a_copy_too_old_to_compare_is_counted_and_still_dropped() -> None:
    a = Assembler(ListenerConfig(keep_digests=2))
    for index in range(4):
        a.offer(chunk("r", index), 1.0)
    assert a.offer(chunk("r", 0), 2.0) == []
    assert a.stats.uncompared == 1 and a.stats.delivered == 4


def test_each_window_keeps_its_own_arrival_time_and_record_timestamp() -> None:
    a = Assembler()
    assert a.offer(chunk("a", 1), 1.0, 2001) == []  # held until window 0
    out = a.offer(chunk("a", 0), 2.0, 2002)
    assert [(c.window_index, c.received_at, c.written_at_ms) for c in out] == [
        (0, 2.0, 2002),
        (1, 1.0, 2001),
    ]


def test_out_of_order_windows_are_held_then_delivered_in_order() -> None:
    a = Assembler()
    assert a.offer(chunk("r", 1), 1.0) == []
    out = a.offer(chunk("r", 0), 1.1)
    assert audio(out) == [("r", 0, 0), ("r", 0, 1)]


def test_a_missing_window_is_skipped_at_the_final_window_and_reported() -> None:
    a = Assembler()
    a.offer(chunk("r", 0), 1.0)
    out = a.offer(chunk("r", 2, final=True), 1.1)
    assert audio(out) == [("r", 0, 2)] and out[0].gap_samples == WINDOW
    report = a.ended("r")
    assert report is not None and report.gap_windows == 1 and report.gap_samples == WINDOW


def test_a_new_epoch_supersedes_the_open_one_and_old_epochs_are_ignored() -> None:
    a = Assembler()
    a.offer(chunk("r", 0, epoch=0), 1.0)
    out = a.offer(chunk("r", 0, epoch=1), 2.0)
    assert [(c.cache_epoch, c.end, bool(c.pcm)) for c in out] == [
        (0, "superseded", False),
        (1, None, True),
    ]
    assert a.offer(chunk("r", 1, epoch=0), 3.0) == []
    assert a.stats.stale == 1


def test_a_superseded_epoch_keeps_its_report() -> None:
    a = Assembler()
    a.offer(chunk("a", 0, epoch=0), 1.0)
    a.offer(chunk("a", 0, epoch=1), 2.0)
    a.offer(chunk("a", 1, epoch=1, final=True), 3.0)
    reports = [(r.request_id, r.cache_epoch, r.windows, r.end) for r in a.reports()]
    assert reports == [("a", 0, 1, "superseded"), ("a", 1, 2, "final")]


def test_the_epoch_floor_skips_epochs_older_than_the_current_one_at_start() -> None:
    a = Assembler(epoch_floor={"r": 2})
    assert a.offer(chunk("r", 0, epoch=1), 1.0) == []
    assert audio(a.offer(chunk("r", 0, epoch=2), 1.0)) == [("r", 2, 0)]
    assert a.stats.skipped_old_epoch == 1


def test_a_corrupt_copy_is_dropped_and_a_good_later_copy_plays() -> None:
    a = Assembler()
    good = chunk("r", 0)
    bad = dataclasses.replace(good, pcm_s16le=bytes(2 * WINDOW))
    assert a.offer(bad, 1.0) == [] and a.stats.corrupt == 1
    assert audio(a.offer(good, 2.0)) == [("r", 0, 0)]


def test_a_request_filter_keeps_only_those_requests() -> None:
    a = Assembler(requests=["b"])
    assert a.offer(chunk("a", 0), 1.0) == []
    assert audio(a.offer(chunk("b", 0), 1.0)) == [("b", 0, 0)]


def test_the_open_stream_cap_evicts_the_least_recently_opened() -> None:
    a = Assembler(ListenerConfig(max_open_streams=2))
    a.offer(chunk("a", 0), 1.0)
    a.offer(chunk("b", 0), 1.0)
    out = a.offer(chunk("c", 0), 1.0)
    assert [(c.request_id, c.end) for c in out] == [("a", "evicted"), ("c", None)]
    assert a.open_streams() == 2 and a.stats.evicted == 1


class FakeConsumer:
    """Plays a list of audio records, a batch per consume()."""

    def __init__(self, values: list[bytes], keys: list[bytes]) -> None:
        self.messages = [
            FakeMessage("audio", 0, i, k, v)
            for i, (v, k) in enumerate(zip(values, keys, strict=True))
        ]
        self.at = 0

    def assign(self, partitions: Any) -> None:
        return None

    def consume(self, n: int, timeout: float) -> list[FakeMessage]:
        batch = self.messages[self.at : self.at + n]
        self.at += len(batch)
        return batch

    def close(self) -> None:
        return None


def test_memory_stays_bounded_with_a_thousand_concurrent_requests() -> None:
    """1,000 requests interleaved, 12 windows each, speculative duplicates of recent windows:
    what the listener holds never exceeds its bound, every window is played
    exactly once, and nothing is held once every stream ended."""
    requests, windows = 1000, 12
    rng = random.Random(7)
    chunks: list[AudioChunk] = []
    for index in range(windows):
        row = [chunk(f"r{n:04d}", index, final=index == windows - 1) for n in range(requests)]
        rng.shuffle(row)
        chunks += row
        chunks += rng.sample(row, 100)  # the committed copies of aborted windows
    values = [wire.encode(c) for c in chunks]
    fake = FakeConsumer(values, [c.request_id.encode() for c in chunks])
    config = ListenerConfig(max_open_streams=requests)
    listener = AudioListener(
        {}, "audio", Isolation.SPECULATIVE, config=config, start=StartMode.BEGINNING,
        partitions=[0], consumer_factory=lambda _: fake,
    )  # fmt: skip
    bound = listener.assembler.max_buffered_bytes(2 * WINDOW)
    played: dict[tuple[str, int], int] = {}
    worst = 0
    while fake.at < len(fake.messages):
        for delivered in listener.poll(max_records=250):
            if delivered.pcm:
                key = (delivered.request_id, delivered.window_index)
                played[key] = played.get(key, 0) + 1
        worst = max(worst, listener.assembler.buffered_bytes())
    assert worst <= bound
    # with keep_pcm=2, at most 2 windows of PCM per open stream plus what is pending
    assert worst <= requests * (config.keep_pcm + config.max_pending) * 2 * WINDOW
    assert len(played) == requests * windows and set(played.values()) == {1}
    assert listener.stats.duplicates == windows * 100 and listener.stats.mismatches == 0
    assert listener.assembler.open_streams() == 0 and listener.assembler.buffered_bytes() == 0
    assert listener.assembler.remembered_streams() <= config.max_open_streams + config.max_ended


def test_ended_and_replaced_streams_are_forgotten_once_their_time_is_up() -> None:
    """A listener runs for days: ended streams and epochs a newer one replaced (their digests,
    for later copies) are kept for `ended_ttl_s`, not until `max_ended` of each piled up (issue
    43's soak saw the listeners grow for its whole hour). A later copy within that time is
    still known; a listener of named requests keeps its few streams."""
    a = Assembler()  # ended_ttl_s 600
    for i in range(1200):  # every second for twenty minutes: an epoch replaced, one ended
        a.offer(chunk(f"r{i}", 0, epoch=0), float(i))
        a.offer(chunk(f"r{i}", 0, epoch=1), float(i))  # epoch 0 is replaced
        a.offer(chunk(f"r{i}", 1, epoch=1, final=True), float(i))
    assert a.remembered_streams() <= 2 * 601  # the last ten minutes'
    assert a.offer(chunk("r700", 1, epoch=1, final=True), 1200.0) == []  # a later copy
    assert a.offer(chunk("r700", 0, epoch=0), 1200.0) == []  # of a replaced epoch too
    assert a.stats.delivered == 3600 and a.stats.mismatches == 0
    named = Assembler(requests=[f"r{i}" for i in range(1200)])
    for i in range(1200):
        named.offer(chunk(f"r{i}", 0, final=True), float(i))
    assert named.remembered_streams() == 1200 and named.ended("r0") is not None


def test_streams_nothing_came_for_end_idle_and_memory_levels_off() -> None:
    """The audio topic carries no end for a request aborted (or evicted) upstream: such a
    stream never gets its final window. Issue 43's hour-long soak saw both listeners hold 700
    such streams open after 38 minutes (and their kept PCM: +1.1 MB a minute, for the whole
    run). Fed by AudioListener.poll as the soak's talker feeds it (every minute streams that
    end and streams whose request is aborted mid-way), the listener ends a stream after
    `idle_end_s` without a copy of any window (`end == "idle"`, its held windows played
    first), and what it holds stops growing once that time and `ended_ttl_s` are past."""
    config = ListenerConfig(idle_end_s=120.0, ended_ttl_s=120.0)
    fake = FakeConsumer([], [])
    now = [0.0]
    listener = AudioListener(
        {}, "audio", Isolation.COMMITTED, config=config, start=StartMode.BEGINNING,
        partitions=[0], consumer_factory=lambda _: fake, clock=lambda: now[0],
    )  # fmt: skip
    ends: dict[str, str | None] = {}
    held: dict[int, tuple[int, int]] = {}
    for minute in range(30):
        for n in range(15):  # ten end with a final window, five are aborted after two
            rid = f"m{minute}-{n}"
            last = 3 if n < 10 else 1
            for index in range(last + 1):
                c = chunk(rid, index, final=n < 10 and index == last)
                fake.messages.append(
                    FakeMessage("audio", 0, len(fake.messages), rid.encode(), wire.encode(c))
                )
        for second in range(0, 60, 5):
            now[0] = minute * 60.0 + second
            for delivered in listener.poll(max_records=1000):
                if delivered.end is not None:
                    ends[delivered.request_id] = delivered.end
        held[minute] = (
            listener.assembler.open_streams(),
            listener.assembler.remembered_streams(),
        )
    assert ends["m0-0"] == "final" and ends["m0-12"] == "idle"
    assert listener.stats.idle_ended == 5 * 28 and listener.stats.mismatches == 0
    # levelled off: open streams are the last idle_end_s' aborted ones, remembered ones the
    # last idle_end_s + ended_ttl_s' (not every aborted stream since the start)
    assert held[29] == held[15] and held[29][0] <= 5 * 3 and held[29][1] <= 15 * 5
    assert listener.assembler.buffered_bytes() <= 5 * 3 * config.keep_pcm * 2 * WINDOW
    late = chunk("m27-12", 2)  # a window of a stream ended idle that comes after all
    fake.messages.append(FakeMessage("audio", 0, len(fake.messages), b"m27-12", wire.encode(late)))
    assert listener.poll() == [] and listener.stats.after_final == 1


def test_a_stream_heard_within_idle_end_s_stays_open() -> None:
    a = Assembler(ListenerConfig(idle_end_s=60.0))
    a.offer(chunk("quiet", 0), 0.0)
    a.offer(chunk("talking", 0), 0.0)
    a.offer(chunk("talking", 2), 50.0)  # held: window 1 has not come
    assert a.expire(59.0) == [] and a.open_streams() == 2
    out = a.expire(61.0)
    assert [(c.request_id, c.end) for c in out] == [("quiet", "idle")]
    assert a.open_streams() == 1 and a.ended("quiet") is not None
    out = a.expire(111.0)  # window 2 is played, window 1 reported missing, then the end
    assert [(c.window_index, c.end) for c in out] == [(2, None), (3, "idle")]
    assert a.stats.gap_windows == 1 and a.open_streams() == 0


def test_listen_refuses_until_final_without_a_request(capsys: Any) -> None:
    from codeclog.cli import main

    assert main(["listen", "--until-final", "--bootstrap", "127.0.0.1:1"]) == 2
    assert capsys.readouterr().err.strip() == "codeclog listen: --until-final needs --request"


def test_the_wav_sink_places_windows_by_sample_offset(tmp_path: Any) -> None:
    import wave

    from codeclog.cli.commands.listen import Sink

    a = Assembler()
    out = a.offer(chunk("r/1", 0), 1.0) + a.offer(chunk("r/1", 2, final=True), 1.0)
    sink = Sink(tmp_path, None)
    for item in out:
        sink.write(item)
    sink.close()
    with wave.open(str(tmp_path / "r_1.e0.wav"), "rb") as wav:
        frames = wav.readframes(wav.getnframes())
    assert frames == out[0].pcm + bytes(2 * WINDOW) + out[1].pcm


class _Eof:
    def error(self) -> Any:
        from confluent_kafka import KafkaError

        return KafkaError(KafkaError._PARTITION_EOF)


class OneTopic(FakeConsumer):
    """A fake with one partition: assign() moves the read position, EOF at its end."""

    def assign(self, partitions: Any) -> None:
        self.at = partitions[0].offset
        self.assigned = partitions

    def consume(self, n: int, timeout: float) -> list[Any]:
        batch: list[Any] = super().consume(n, timeout)
        return batch or [_Eof()]

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        return 0, len(self.messages)

    def assignment(self) -> Any:
        return self.assigned

    def position(self, partitions: Any) -> Any:
        from confluent_kafka import TopicPartition

        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in partitions]  # unset

    def close(self) -> None:
        return None


def test_a_listener_started_at_a_partitions_end_is_caught_up_before_reading_anything() -> None:
    """The request is not on the partition: reading starts at its end, and nothing consumed
    there leaves librdkafka's position unset; caught_up() must still hold (else
    `codeclog listen --exit-when-idle` never exits)."""
    values = [wire.encode(chunk("other", i)) for i in range(3)]
    listener = AudioListener(
        {}, "audio", Isolation.SPECULATIVE, requests=["mine"], partitions=[0],
        consumer_factory=lambda _: OneTopic(values, [b"other"] * 3),
    )  # fmt: skip
    listener.start()
    assert listener.caught_up()


class TwoTopics(FakeConsumer):
    """The live and the audio topic: records the assignment, plays the given messages."""

    def __init__(self, messages: list[FakeMessage]) -> None:
        self.messages = messages
        self.at = 0
        self.assigned: list[Any] = []

    def assign(self, partitions: Any) -> None:
        self.assigned = [(tp.topic, tp.partition) for tp in partitions]


def test_a_speculative_listener_reads_the_live_and_the_audio_topic_and_tells_them_apart() -> None:
    live, committed = chunk("r", 0), chunk("r", 0)
    messages = [
        FakeMessage("audio.live", 0, 0, b"r", wire.encode(live)),
        FakeMessage("audio", 0, 0, b"r", wire.encode(committed)),
    ]
    fake = TwoTopics(messages)
    listener = AudioListener(
        {}, "audio", Isolation.SPECULATIVE, start=StartMode.BEGINNING, partitions=[0],
        consumer_factory=lambda _: fake,
    )  # fmt: skip
    played = listener.poll()
    assert fake.assigned == [("audio.live", 0), ("audio", 0)]
    assert audio(played) == [("r", 0, 0)] and not played[0].committed
    assert listener.stats.confirmed == 1 and listener.stats.duplicates == 0
    only = TwoTopics([])
    AudioListener(
        {}, "audio", Isolation.COMMITTED, start=StartMode.BEGINNING, partitions=[0],
        consumer_factory=lambda _: only,
    ).start()  # fmt: skip
    assert only.assigned == [("audio", 0)]


def test_a_lost_live_copy_is_waited_for_past_the_live_final_and_played_from_committed() -> None:
    """The live copy is best effort (docs/listening.md, limit 5): across a whole-cluster `down`
    the soak's speculative listener got the live copies of a request's last windows and its
    final one, not of the windows before them, skipped those as a gap at the live final and
    dropped their committed copies when they came (run 3: 10 windows). Only a committed copy
    proves a gap (an epoch's committed copies come in window order), so the live final waits."""
    a = Assembler()
    out = a.offer(chunk("r", 0), 1.0, committed=False)
    out += a.offer(chunk("r", 3), 1.1, committed=False)
    out += a.offer(chunk("r", 4, final=True), 1.2, committed=False)  # the live 1..2 were lost
    assert audio(out) == [("r", 0, 0)] and a.stats.gap_windows == 0
    for index in range(5):
        out += a.offer(chunk("r", index, final=index == 4), 2.0 + index / 10, committed=True)
    assert audio(out) == [("r", 0, i) for i in range(5)]
    assert [c.committed for c in out if c.pcm] == [False, True, True, False, False]
    report = a.ended("r")
    assert report is not None and report.end == "final" and report.gap_windows == 0
    assert report.confirmed == 5 and a.stats.duplicates == 0


def test_a_committed_copy_beyond_a_gap_proves_it_in_a_speculative_listener_too() -> None:
    a = Assembler()
    a.offer(chunk("r", 0), 1.0, committed=False)
    out = a.offer(chunk("r", 2, final=True), 1.1, committed=False)
    assert out == []
    out = a.offer(chunk("r", 2, final=True), 1.2, committed=True)  # no committed window 1
    assert audio(out) == [("r", 0, 2)] and a.stats.gap_windows == 1


def test_live_copies_beyond_a_lost_one_are_set_aside_past_max_pending_and_played_later() -> None:
    """Memory stays bounded while a lost live copy is waited for: the newest live copies beyond
    `max_pending` are set aside (not played, not remembered); their committed copies play them
    in order."""
    a = Assembler(ListenerConfig(max_pending=2))
    out = a.offer(chunk("r", 0), 1.0, committed=False)
    for index in range(2, 8):  # the live copy of window 1 was lost
        out += a.offer(chunk("r", index, final=index == 7), 1.0 + index / 10, committed=False)
        assert a.buffered_bytes() <= (2 + a.config.keep_pcm) * 2 * WINDOW
    assert audio(out) == [("r", 0, 0)] and a.stats.live_set_aside == 4
    for index in range(8):
        out += a.offer(chunk("r", index, final=index == 7), 3.0 + index / 10, committed=True)
    assert audio(out) == [("r", 0, i) for i in range(8)]
    report = a.ended("r")
    assert report is not None and report.gap_windows == 0 and report.confirmed == 8


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_speculative_listener_plays_every_committed_window_once_in_order(data: Any) -> None:
    """Whatever live copies are lost, repeated or reordered, and however they interleave with
    the committed copies (which come in window order), each window is played once, in order,
    with no gap, and memory stays within max_pending."""
    n = data.draw(st.integers(1, 12), label="windows")
    max_pending = data.draw(st.integers(1, 4), label="max_pending")
    live = data.draw(st.lists(st.integers(0, n - 1), max_size=2 * n), label="live copies")
    committed = list(range(n))
    order = data.draw(st.permutations([True] * len(live) + [False] * n), label="interleaving")
    a = Assembler(ListenerConfig(max_pending=max_pending))
    out: list[ListenerChunk] = []
    for t, is_live in enumerate(order):
        index = live.pop(0) if is_live else committed.pop(0)
        out += a.offer(chunk("r", index, final=index == n - 1), t / 10, committed=not is_live)
        assert a.buffered_bytes() <= (max_pending + a.config.keep_pcm) * 2 * WINDOW
    assert audio(out) == [("r", 0, i) for i in range(n)]
    report = a.ended("r")
    assert report is not None and report.gap_windows == 0 and report.confirmed == n


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_speculative_listener_plays_every_epochs_committed_windows_once_in_order(
    data: Any,
) -> None:
    """As above across epochs (turns and barge-ins of one request): the committed copies come
    epoch after epoch in window order; live copies of any epoch come lost, repeated or early.
    The speculative listener plays what the committed listener plays."""
    sizes = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3), label="epochs")
    windows = [(e, i) for e, n in enumerate(sizes) for i in range(n)]
    final = {(e, n - 1) for e, n in enumerate(sizes)}
    live = data.draw(st.lists(st.sampled_from(windows), max_size=2 * len(windows)), label="live")
    committed = list(windows)
    order = data.draw(st.permutations([True] * len(live) + [False] * len(windows)), label="order")
    arrivals = [live.pop(0) if is_live else committed.pop(0) for is_live in order]
    # the listener has heard of an epoch before a newer one comes (else it cannot know it
    # exists: docs/listening.md, limit 5)
    assume(all(e == 0 or any(p == e - 1 for p, _ in arrivals[:k]) for k, (e, _) in
               enumerate(arrivals)))  # fmt: skip
    a = Assembler(ListenerConfig(max_pending=data.draw(st.integers(1, 4), label="max_pending")))
    out: list[ListenerChunk] = []
    for t, (is_live, (epoch, index)) in enumerate(zip(order, arrivals, strict=True)):
        copy = chunk("r", index, epoch, (epoch, index) in final)
        out += a.offer(copy, t / 10, committed=not is_live)
        assert a.buffered_bytes() <= a.max_buffered_bytes(2 * WINDOW)
    assert audio(out) == [("r", e, i) for e, i in windows]
    assert a.stats.gap_windows == 0 and a.stats.confirmed == len(windows)
