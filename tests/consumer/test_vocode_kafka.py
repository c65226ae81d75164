"""The Code2Wav consumer on the real broker with the tiny vocoder: exactly once, isolation."""

from __future__ import annotations

import hashlib
import json
import random
import re
import signal
import threading
import time
from typing import Any

import pytest

from codeclog.cli import main
from consumers.fold.machine import Policy
from consumers.pipeline import AudioPipeline, InputRecord, PipelineConfig, Position
from consumers.service import VocodeConfig, VocoderService, read_partition
from consumers.verify import actual_audio, verify
from schemas import wire
from schemas.records import AudioChunk, CodecChunk, DeadLetter

pytestmark = [pytest.mark.kafka, pytest.mark.vocoder, pytest.mark.slow]


def _run_in_process(stack: Any, engine: Any, instance: str = "0") -> VocoderService:
    config = VocodeConfig(group=stack.group, instance_id=instance, exit_when_idle_s=5.0)
    service = VocoderService(stack.client, stack.topics, config, engine)
    assert service.run() == 0
    return service


def _dead_letters(stack: Any) -> list[DeadLetter]:
    letters = []
    for record in read_partition(stack.client, stack.topics.dlq, 0, 0, None):
        letter = wire.decode(record.value)
        assert isinstance(letter, DeadLetter)
        letters.append(letter)
    return letters


def test_sessions_end_to_end_match_an_offline_replay(
    stack: Any, tiny_engine: Any, tmp_path: Any, capsys: Any
) -> None:
    stack.publish_sessions(sessions=6, seconds=6, seed=11)
    service = _run_in_process(stack, tiny_engine)
    assert service.stats["windows"] > 0
    report = verify(stack.client, stack.topics, tiny_engine)
    assert report.ok, report.to_dict()
    assert report.expected_windows == service.stats["windows"]
    assert report.requests >= 6
    # The operator's path: capture the input topic, replay the file offline with the vocoder:
    # the same per-request audio hashes as the live consumer wrote to the audio topic.
    capture = tmp_path / "input.ocf"
    cluster = ["--bootstrap", stack.bootstrap]
    assert main(["capture", "--topic", stack.topics.chunks, "--out", str(capture), *cluster]) == 0
    capsys.readouterr()
    # the consumer ran native kernels on this machine: replay in the same domain
    assert main(["replay", str(capture), "--vocoder", "tiny", "--kernels", "native", "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out)["requests"]
    live = _live_request_hashes(stack)
    assert live and {rid: replayed[rid]["audio"]["sha256"] for rid in live} == live


class _HeldDecodes:
    """The engine, except that the first decode_batch call of each of the first `holds` steps
    is held (on that step's decode thread) until the service has paused since the previous held
    step, or HOLD_S passes; `saw_pause` records per held step whether the pause came. A step
    pauses at most once, and the previous held step was released only after its own pause, so
    the pause awaited is this step's (made before or during the hold). This counts pauses by
    event, whatever the decode time against the poll timeout."""

    HOLD_S = 60.0

    def __init__(self, engine: Any, holds: int) -> None:
        self._engine = engine
        self._holds = holds
        self._steps: list[threading.Thread] = []  # the decode thread of each held step
        self._pauses_seen = 0
        self.service: VocoderService | None = None
        self.saw_pause: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def decode_batch(self, items: Any) -> Any:
        step = threading.current_thread()  # each step decodes on a thread of its own
        if len(self._steps) < self._holds and step not in self._steps:
            self._steps.append(step)
            assert self.service is not None
            stats = self.service.stats
            deadline = time.monotonic() + self.HOLD_S
            while stats["pauses"] <= self._pauses_seen and time.monotonic() < deadline:
                time.sleep(0.005)
            self.saw_pause.append(stats["pauses"] > self._pauses_seen)
            self._pauses_seen = stats["pauses"]
        return self._engine.decode_batch(items)


def test_a_saturated_decoder_pauses_and_stays_exactly_once(stack: Any, tiny_engine: Any) -> None:
    """Everything is published before the consumer starts and a step takes 4 records: while a
    step decodes, the next batch is polled at once and the assignment is paused. The first
    three decoding steps are held until the service pauses (`_HeldDecodes`), so each must see
    a pause however fast the engine is. No step is voided, and the audio is exactly once and
    byte-identical to an offline replay."""
    stack.publish_sessions(sessions=4, seconds=5, seed=12)
    config = VocodeConfig(group=stack.group, exit_when_idle_s=5.0, max_records=4)
    held = _HeldDecodes(tiny_engine, holds=3)
    service = VocoderService(stack.client, stack.topics, config, held)
    held.service = service
    assert service.run() == 0
    assert held.saw_pause == [True, True, True], "a held decode saw no pause"
    assert service.stats["pauses"] >= 3 and service.stats["steps"] > 3
    assert service.stats["void_steps"] == 0
    report = verify(stack.client, stack.topics, tiny_engine)
    assert report.ok, report.to_dict()
    assert report.expected_windows == service.stats["windows"] > 0


def _live_request_hashes(stack: Any) -> dict[str, str]:
    pcm: dict[str, list[tuple[int, int, bytes]]] = {}
    for partition in range(stack.topics.partitions):
        for record in read_partition(stack.client, stack.topics.audio, partition, 0, None):
            chunk = wire.decode(record.value)
            assert isinstance(chunk, AudioChunk)
            pcm.setdefault(chunk.request_id, []).append(
                (record.position.offset, chunk.window_index, chunk.pcm_s16le)
            )
    return {
        rid: hashlib.sha256(b"".join(p for _, _, p in sorted(items))).hexdigest()
        for rid, items in pcm.items()
    }


def test_sigkill_at_random_points_keeps_audio_exactly_once(stack: Any, tiny_engine: Any) -> None:
    stack.publish_sessions(sessions=12, seconds=10, seed=5)
    rng = random.Random(1234)
    for _ in range(6):
        process = stack.vocode("k", "--max-records", "8", idle_s=30)  # small steps: many commits
        stack.wait_for_log(process, "state restored in", 120)
        time.sleep(rng.uniform(0.5, 4.0))  # somewhere inside a step, or between two
        process.send_signal(signal.SIGKILL)
        process.wait()
    final = stack.vocode("k", "--max-records", "8", idle_s=4)
    assert final.wait(240) == 0, stack.logs()
    report = verify(stack.client, stack.topics, tiny_engine)
    assert report.ok, (report.to_dict(), stack.logs())
    assert report.expected_windows > 50
    assert re.search(r"rebuilt [1-9]\d* open streams", stack.logs()), "no recovery was exercised"


def test_two_members_and_a_rebalance_mid_stream_keep_audio_exactly_once(
    stack: Any, tiny_engine: Any
) -> None:
    stack.publish_sessions(sessions=6, seconds=6, seed=9)
    first = stack.vocode("a", idle_s=120)
    stack.wait_for_log(first, "state restored in", 120)
    second = stack.vocode("b", idle_s=10)  # joins: partitions move while streams are open
    stack.wait_for_log(second, "state restored in", 120)
    stack.publish_sessions(sessions=6, seconds=6, seed=10)
    time.sleep(1.0)
    first.send_signal(signal.SIGTERM)  # leaves mid-stream: its partitions move again
    assert first.wait(120) == 0, stack.logs()
    stack.publish_sessions(sessions=4, seconds=4, seed=11)
    assert second.wait(240) == 0, stack.logs()
    report = verify(stack.client, stack.topics, tiny_engine)
    assert report.ok, (report.to_dict(), stack.logs())


def _poison(stack: Any) -> list[tuple[bytes | None, bytes]]:
    good = CodecChunk("p-out-of-range", (4218, 4218, 4218, *range(100, 124), 7000), 0, 0, 28, 25, 3)
    unknown = b"\xc3\x01" + bytes(8) + b"\x02"
    scenario = [
        CodecChunk("p-stale", (4218,) * 3 + tuple(range(25)), 2, 0, 28, 25, 3),
        CodecChunk("p-stale", (4218,) * 3 + tuple(range(25)), 1, 0, 28, 25, 3),  # T4
        CodecChunk("p-dup", (4218,) * 3 + tuple(range(25)), 0, 0, 28, 25, 3),
        CodecChunk("p-dup", (4218,) * 3 + tuple(range(24)) + (9,), 0, 0, 28, 25, 3),  # T6
        CodecChunk("p-empty", (0,), 0, 0, 0),  # A3 empty non-final
        CodecChunk("p-final", (1, 2, 3, 4), 0, 0, 4, last_chunk=True),
        CodecChunk("p-final", (1, 2, 3, 4, 5), 0, 1, 5),  # T3 chunk after final
        CodecChunk("", (1, 2, 3, 4), 0, 0),  # T1 missing request id
        CodecChunk("p-neg", (1, 2, 3, 4), -1, 0),  # T2
        CodecChunk("p-numel", (1, 2, 3), 0, 0, 9),  # invalid frame count
    ]
    records: list[tuple[bytes | None, bytes]] = [
        (b"p-garbage", b"\x00\x01garbage"),
        (b"p-unknown", unknown),
        (b"p-out-of-range", wire.encode(good)),
    ]
    records += [(c.request_id.encode() or None, wire.encode(c)) for c in scenario]
    return records


def test_poison_records_are_dead_lettered_and_good_audio_is_unchanged(
    stack: Any, tiny_engine: Any
) -> None:
    stack.publish_sessions(sessions=4, seconds=4, seed=3)
    clean = _good_audio(stack, tiny_engine)
    stack.publish_raw(_poison(stack))
    stack.publish_sessions(sessions=4, seconds=4, seed=4)
    _run_in_process(stack, tiny_engine)
    reasons = {letter.reason for letter in _dead_letters(stack)}
    assert {
        "undecodable_record",
        "invalid_codes",
        "stale_cache_epoch",
        "conflicting_duplicate",
        "empty_nonfinal_chunk",
        "chunk_after_final",
        "missing_request_id",
        "negative_stream_position",
        "invalid_frame_count",
    } <= reasons
    windows, _ = actual_audio(stack.client, stack.topics)
    for key, sha in clean.items():
        assert windows[key] == [sha]
    assert verify(stack.client, stack.topics, tiny_engine).ok


def _good_audio(stack: Any, engine: Any) -> dict[tuple[str, int, int], str]:
    pipeline = AudioPipeline(PipelineConfig(record_audio=True), engine, clock_ms=lambda: 0)
    for partition in range(stack.topics.partitions):
        records = read_partition(stack.client, stack.topics.chunks, partition, 0, None)
        pipeline.step(
            [
                InputRecord(
                    Position(r.position.topic, partition, r.position.offset), r.key, r.value
                )
                for r in records
            ]
        )
    return {
        (rid, w["cache_epoch"], w["window_index"]): w["sha256"]
        for rid, audio in pipeline.audio.items()
        for w in audio.windows
    }


def test_strict_policy_stops_at_the_first_rejection(stack: Any, tiny_engine: Any) -> None:
    stack.publish_raw([(b"s1", wire.encode(CodecChunk("s1", (0,))))])
    config = VocodeConfig(group=stack.group, policy=Policy.STRICT, exit_when_idle_s=5.0)
    service = VocoderService(stack.client, stack.topics, config, tiny_engine)
    assert service.run() == 3
    assert [d.reason for d in _dead_letters(stack)] == ["chunk_below_lookahead_window"]
