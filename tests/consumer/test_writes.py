"""What a step writes, without a broker: one encoding of each window for its live and its
committed copy, and steps that queued together merged into one transaction."""

from __future__ import annotations

import hashlib

from confluent_kafka import TopicPartition

from codeclog.consumers.member.step_writes import (
    OutputRecord,
    StepWrites,
    audio_records,
    live_writes,
    merged,
    step_writes,
)
from codeclog.consumers.stream.pipeline import StepOutput
from codeclog.schemas import wire
from codeclog.schemas.records import AudioChunk
from codeclog.topics_config import TopicsConfig


def _chunk(rid: str, index: int) -> AudioChunk:
    pcm = bytes([index + 1]) * 96
    return AudioChunk(
        request_id=rid,
        cache_epoch=0,
        chunk_seqs=(index,),
        window_index=index,
        sample_offset=48 * index,
        sample_rate_hz=24000,
        pcm_s16le=pcm,
        sha256=hashlib.sha256(pcm).hexdigest(),
        final=False,
        determinism_domain="d",
    )


def test_the_live_copy_and_the_committed_copy_are_the_same_records() -> None:
    topics = TopicsConfig(audio="a", chunks="c", dlq="d", progress="p")
    out = StepOutput(audio=[_chunk("r1", 0), _chunk("r2", 0), _chunk("r1", 1)])
    audio = audio_records(out)
    live = live_writes(audio, topics)
    committed, checkpoints = step_writes(out, audio, [], topics, "g")
    assert topics.live == "a.live" and checkpoints == []
    assert [w.topic for w in live] == ["a.live"] * 3 and [w.topic for w in committed] == ["a"] * 3
    assert [(w.key, w.value) for w in live] == [(w.key, w.value) for w in committed]
    assert [wire.decode(w.value) for w in live] == out.audio
    assert all(w.value is c.value for w, c in zip(live, committed, strict=True))  # built once


def _checkpoint(key: str, partition: int, value: bytes) -> OutputRecord:
    return OutputRecord("p", key, value, partition)


def test_merged_steps_keep_their_records_in_order_and_the_newest_checkpoint_per_request() -> None:
    first = StepWrites(
        [OutputRecord("a", "r1", b"w1"), OutputRecord("d", "r2", b"dead")],
        [_checkpoint("g\x1fr1", 0, b"r1@1"), _checkpoint("g\x1fr2", 1, b"r2@1")],
        [TopicPartition("c", 0, 5)],
        "meta-1",
    )
    second = StepWrites(
        [OutputRecord("a", "r1", b"w2")],
        [_checkpoint("g\x1fr1", 0, b"r1@2")],
        [TopicPartition("c", 0, 9), TopicPartition("c", 1, 3)],
        "meta-2",
    )
    step = merged([first, second])
    assert [w.value for w in step.records] == [b"w1", b"dead", b"w2"]
    assert [w.value for w in step.checkpoints] == [b"r2@1", b"r1@2"]
    assert step.positions == second.positions and step.group_metadata == "meta-2"
    assert merged([first]) is first
    assert step.size == len(b"w1dead" + b"w2" + b"r2@1" + b"r1@2")
