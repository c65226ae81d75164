"""The open-stream cap on a real broker (rule C1a; issue 29's defects 1 and 2): more idle
requests than the cap arrive while clean sessions speak; the member is stopped (SIGTERM) and
restarted; late final chunks of evicted requests follow. Every eviction is written once, no
clean session is cut, and verify, replaying with the same cap, finds the audio exactly once."""

from __future__ import annotations

import collections
import json
import signal
import threading
import time
from typing import Any

import pytest

from codeclog.consumers.readers.verify import verify
from codeclog.consumers.stream.limit import LimitOptions
from codeclog.kafka.reader import read_partition
from codeclog.kafka.topics import ensure_topics
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk, DeadLetter
from tests.consumer.conftest import LiveTalker, topics_file
from tests.topics import fresh_topics

pytestmark = pytest.mark.kafka

CAP = 8  # over the group: 4 open streams per partition of the test's 2
IDLE = 40  # idle requests: ten times a partition's share
HELD = (10, 11)  # two frames: held, so the stream stays open and idle


def idle_chunk(rid: str) -> bytes:
    return wire.encode(CodecChunk(request_id=rid, cache_epoch=0, chunk_seq=0, codes=HELD))


def late_final_chunk(rid: str) -> bytes:
    chunk = CodecChunk(
        request_id=rid, cache_epoch=0, chunk_seq=1, codes=(12, 13, 14, 15), last_chunk=True
    )
    return wire.encode(chunk)


def trickle(stack: Any, rids: list[str], every_s: float) -> threading.Thread:
    """The idle requests, one at a time: never a burst larger than a partition's share, so
    the clean sessions (25 chunks/s each) always spoke after the older idle streams."""

    def publish() -> None:
        for rid in rids:
            stack.publish_raw([(rid.encode(), idle_chunk(rid))])
            time.sleep(every_s)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    return thread


def dead_letters(stack: Any) -> list[DeadLetter]:
    letters = []
    for partition in range(stack.topics.dlq_partitions):
        for record in read_partition(stack.client, stack.topics.dlq, partition, 0, None):
            letter = wire.decode(record.value)
            assert isinstance(letter, DeadLetter)
            letters.append(letter)
    return letters


def test_idle_requests_beyond_the_cap_are_evicted_once_across_a_restart(
    stack: Any, tiny_engine: Any, unique_name: Any
) -> None:
    stack.topics = fresh_topics(unique_name, partitions=2)
    ensure_topics(stack.client, stack.topics)
    stack.topics_file = topics_file(stack.topics, stack.tmp)
    idle = [f"idle-{n:03d}" for n in range(IDLE)]
    cap = ("--max-open-streams", str(CAP))

    member = stack.vocode("0", *cap, idle_s=60.0)
    stack.wait_for_log(member, "open streams: at most 4 open streams per partition", 60)
    talker = LiveTalker(stack, sessions=2, seconds=8.0, seed=29, producer_id="clean")
    trickle(stack, idle[: IDLE // 2], every_s=0.1).join(30)
    time.sleep(1.0)
    member.send_signal(signal.SIGTERM)  # stop with evictions committed, sessions mid-turn
    assert member.wait(60) == 0, stack.logs()

    member = stack.vocode("0", *cap, idle_s=4.0)
    trickle(stack, idle[IDLE // 2 :], every_s=0.1).join(30)
    talker.join(60)
    assert talker.delivered_everything
    stack.publish_raw([(rid.encode(), late_final_chunk(rid)) for rid in idle])
    assert stack.stop_once_committed(member, 120) == 0, stack.logs()

    letters = dead_letters(stack)
    evictions = [d for d in letters if "evicted_by" in json.loads(d.details_json)]
    per_request = collections.Counter(d.request_id for d in evictions)
    assert per_request and max(per_request.values()) == 1, per_request  # once, not per restart
    assert all(rid in idle for rid in per_request), per_request  # no clean session cut
    for letter in evictions:  # named after the record that evicted it
        assert letter.source_topic == stack.topics.chunks and letter.source_offset >= 0
    late = {d.request_id for d in letters if d.reason == "evicted" and d not in evictions}
    assert late == set(per_request)  # each evicted request's late final chunk: rejected
    assert len(per_request) >= IDLE - CAP  # all but the last few idle streams were evicted

    report = verify(stack.client, stack.topics, tiny_engine, stream_limits=LimitOptions(CAP))
    assert report.ok, report.to_dict()
    assert "at most 4 open streams per partition" in report.stream_limit
