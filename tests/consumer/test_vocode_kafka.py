"""The Code2Wav consumer on the real broker with the tiny vocoder: exactly once, isolation."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import threading
import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from codeclog.cli import main
from codeclog.consumers.member.service import StrictFatalError, VocodeConfig, VocoderService
from codeclog.consumers.readers.verify import actual_audio, verify
from codeclog.consumers.stream.fold.state import Policy
from codeclog.consumers.stream.pipeline import AudioPipeline, PipelineConfig
from codeclog.kafka.reader import read_partition
from codeclog.kafka.records import InputRecord, Position
from codeclog.lag.readers import CommittedReader
from codeclog.schemas import wire
from codeclog.schemas.records import AudioChunk, CodecChunk, DeadLetter
from tests.consumer.audio_ends import audio_ends
from tests.consumer.conftest import LiveTalker

pytestmark = [pytest.mark.kafka, pytest.mark.vocoder, pytest.mark.slow]


def _run_in_process(stack: Any, engine: Any, instance: str = "0") -> VocoderService:
    config = VocodeConfig(group=stack.group, instance_id=instance, exit_when_idle_s=2.0)
    service = VocoderService(stack.client, stack.topics, config, engine)
    service.run()
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
            service = self.service
            assert service is not None
            deadline = time.monotonic() + self.HOLD_S
            while service.stats["pauses"] <= self._pauses_seen and time.monotonic() < deadline:
                time.sleep(0.005)
            pauses = service.stats["pauses"]  # a snapshot: read again each time
            self.saw_pause.append(pauses > self._pauses_seen)
            self._pauses_seen = pauses
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
    service.run()
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


RESTORED = re.compile(r"partition \d+: restored \d+ requests, rebuilt (\d+) open streams")
FRESH = re.compile(r"partitions \[([\d, ]+)\]: no checkpoint")
KILLS = ("after", "during", "after", "after")  # relative to recovery
# (the first member has nothing to recover: its partitions are fresh, so it is killed "after")


class _Budget:
    """One deadline for every wait of a test, below its pytest timeout: a wait that runs out
    fails with what it waited for and the logs, not with a pytest-timeout traceback."""

    def __init__(self, stack: Any, seconds: float) -> None:
        self.stack = stack
        self.deadline = time.monotonic() + seconds

    def wait(self, what: str, condition: Any, process: Any = None, poll_s: float = 0.02) -> None:
        while not condition():
            if process is not None and process.poll() is not None:
                raise AssertionError(f"exited ({process.returncode}) before {what}")
            if time.monotonic() > self.deadline:
                raise AssertionError(f"budget spent waiting for {what}:\n{self.stack.logs()}")
            time.sleep(poll_s)

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 1.0)


def _restored(stack: Any, process: Any) -> int:
    """Partitions the process has finished restoring in its newest assignment: one line per
    partition with a checkpoint, one line listing the fresh ones, then "state restored in"."""
    log = stack.log_of[process.pid].read_text(errors="replace")
    if "state restored in" in log:
        return int(stack.topics.partitions)
    fresh = sum(len(m.split(",")) for m in FRESH.findall(log))
    return len(RESTORED.findall(log)) + fresh


def _committed(stack: Any, admin: AdminClient) -> int:
    """The group's committed chunk offsets, summed: they move only when a transaction commits
    (its offsets and checkpoints are in it), so a rise proves a member left progress behind.
    Read as the lag exporter reads them (CommittedReader: an AdminClient's OffsetFetch can
    crash the process when the coordinator moves, docs/lag.md)."""
    reader = CommittedReader(stack.client, timeout_s=30.0)
    try:
        offsets = reader.read(stack.group, stack.topics.chunks, range(stack.topics.partitions))
    finally:
        reader.close()
    return sum(offset or 0 for offset in offsets.values())


def _open_audio_transaction(stack: Any, admin: AdminClient, baseline: dict[int, int]) -> bool:
    """Some audio partition holds records of a transaction opened after `baseline` (the high
    watermarks when this member started): its last stable offset is at or past the baseline
    (an earlier member's transaction is resolved) and below the high watermark."""
    stable, high = audio_ends(stack, admin)
    return any(baseline[p] <= stable[p] < high[p] for p in high)


@pytest.mark.timeout(600)
def test_sigkill_at_random_points_keeps_audio_exactly_once(stack: Any, tiny_engine: Any) -> None:
    """Four SIGKILLs, each checked to have interrupted open work: "during" kills land as soon as
    the first partition is restored (checked: not every partition was restored yet); "after"
    kills wait until every partition is restored, the member has committed once (so recovery
    always has checkpoints to rebuild) and an audio transaction is open, freeze the
    process (SIGSTOP) and check the transaction is still open (its records sit above the last
    stable offset; otherwise its commit won: continue and try again), then kill it and check
    it was left open (the next member's fencing aborts it). Every wait draws on one budget
    below the test timeout and fails with the logs when spent."""
    stack.publish_sessions(sessions=12, seconds=10, seed=5)
    budget = _Budget(stack, 540)
    partitions = stack.topics.partitions
    interrupted: list[tuple[str, bool]] = []
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    for kind in KILLS:
        baseline = audio_ends(stack, admin)[1]
        process = stack.vocode("k", "--max-records", "8", idle_s=30)  # small steps: many commits
        if kind == "during":
            budget.wait(
                "a first restored partition", lambda p=process: _restored(stack, p) > 0, process
            )
        else:
            budget.wait(
                "every partition restored",
                lambda p=process: _restored(stack, p) == partitions,
                process,
            )
            # this member commits once before the freeze, so the next one has checkpoints to
            # rebuild from (killed in its first transaction, no member would ever leave any)
            before = _committed(stack, admin)
            budget.wait("a first commit", lambda b=before: _committed(stack, admin) > b, process)
            open_work = lambda b=baseline: _open_audio_transaction(stack, admin, b)  # noqa: E731
            while True:  # freeze inside an open transaction (its commit may win the race)
                budget.wait("an open audio transaction", open_work, process, 0)
                process.send_signal(signal.SIGSTOP)
                time.sleep(0.5)  # a commit already sent lands now: then this is not open work
                if open_work():
                    break
                process.send_signal(signal.SIGCONT)
        process.send_signal(signal.SIGKILL)
        process.wait()
        if kind == "during":
            interrupted.append((kind, _restored(stack, process) < partitions))
        else:
            interrupted.append((kind, _open_audio_transaction(stack, admin, baseline)))
    # Every "after" kill must have interrupted an open transaction. Since recovery reads all
    # progress partitions at once, a "during" kill lands inside recovery only sometimes (its
    # window is a partition's rebuild): those are recorded, not required.
    assert all(hit for kind, hit in interrupted if kind == "after"), interrupted
    final = stack.vocode("k", "--max-records", "8", idle_s=4)
    assert final.wait(budget.left()) == 0, stack.logs()
    report = verify(stack.client, stack.topics, tiny_engine)
    assert report.ok, (report.to_dict(), stack.logs())
    assert report.expected_windows > 50
    assert re.search(r"rebuilt [1-9]\d* open streams", stack.logs()), "no recovery was exercised"


REBUILT = re.compile(r"partition (\d+): restored \d+ requests, rebuilt (\d+) open streams")


def _open_streams_written_by(stack: Any, producer_id: str) -> dict[int, set[str]]:
    """Partition -> requests whose newest checkpoint on the progress topic is open and was
    written by `producer_id` (the member that holds them now)."""
    from codeclog.kafka.reader import read_partitions

    newest: dict[tuple[int, str], Any] = {}
    parts = list(range(stack.topics.partitions))
    for partition, records in read_partitions(stack.client, stack.topics.progress, parts).items():
        for record in records:
            if not record.value:
                continue
            checkpoint = wire.decode(record.value)
            newest[(partition, checkpoint.request_id)] = checkpoint
    out: dict[int, set[str]] = {}
    for (partition, rid), checkpoint in newest.items():
        if checkpoint.open and checkpoint.producer_id == producer_id:
            out.setdefault(partition, set()).add(rid)
    return out


def _wait_until(condition: Any, timeout_s: float, what: str, state: Any) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = condition()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} not within {timeout_s} s: {state()}"
        time.sleep(0.5)


def test_two_members_and_a_rebalance_mid_stream_keep_audio_exactly_once(
    stack: Any, tiny_engine: Any
) -> None:
    """A partition holding open streams moves from one member to the other (the first leaves
    with SIGTERM while a realtime talker is in the middle of its sessions): the second member
    rebuilds those streams, and the audio stays exactly once."""
    stack.publish_sessions(sessions=6, seconds=6, seed=9)
    first = stack.vocode("a", idle_s=120)
    stack.wait_for_log(first, "state restored in", 120)
    second = stack.vocode("b", idle_s=15)  # joins: partitions move
    stack.wait_for_log(second, "state restored in", 120)
    live = LiveTalker(stack, sessions=6, seconds=12, seed=10)
    # Wait (bounded) until the first member committed open streams of the live sessions on a
    # partition it holds, then make it leave while they are still open.
    holder = f"{stack.group}-a"
    held = _wait_until(
        lambda: _open_streams_written_by(stack, holder),
        60,
        "the first member committing an open stream",
        stack.logs,
    )
    first.send_signal(signal.SIGTERM)  # leaves mid-stream: its partitions move to the second
    assert first.wait(120) == 0, stack.logs()
    live.join(120)
    assert live.delivered_everything, stack.logs()
    assert stack.stop_once_committed(second, 240) == 0, stack.logs()
    second_log = stack.log_of[second.pid].read_text(errors="replace")
    moved = {int(p): int(n) for p, n in REBUILT.findall(second_log)}
    assert any(moved.get(p, 0) > 0 for p in held), (
        f"no partition with open streams moved: first member held {held}, the second rebuilt "
        f"{moved}\n{stack.logs()}"
    )
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
        assert [window.rehash for window in windows[key]] == [sha]
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
    with pytest.raises(StrictFatalError, match="chunk_below_lookahead_window"):
        service.run()
    assert [d.reason for d in _dead_letters(stack)] == ["chunk_below_lookahead_window"]


@pytest.mark.long  # the one-line exit is unit-tested in test_service_liveness.py
def test_a_fenced_member_ends_with_one_line_and_exit_1(stack: Any, tiny_engine: Any) -> None:
    """A second member with the same instance id fences the first (init_transactions bumps the
    epoch): the first ends with one line naming the fence and exit 1, no traceback."""
    stack.publish_sessions(sessions=6, seconds=10, seed=13)  # many small steps to commit
    first = stack.vocode("same", "--max-records", "2", idle_s=120)
    stack.wait_for_log(first, "state restored in", 120)
    second = stack.vocode("same", "--max-records", "2", idle_s=8)
    assert first.wait(120) == 1, stack.logs()
    text = stack.log_of[first.pid].read_text(errors="replace")
    assert "Traceback" not in text, text
    ends = [line for line in text.splitlines() if line.startswith("codeclog vocode:")]
    assert len(ends) == 1 and "fenced" in ends[0], text
    assert second.wait(240) == 0, stack.logs()
    report = verify(stack.client, stack.topics, tiny_engine)
    assert report.ok, (report.to_dict(), stack.logs())
