"""The operator's oracle: is the audio topic exactly the offline replay of the input topic?

It reads every committed record of the chunk topic and of the audio topic, replays the chunks
offline through the same AudioPipeline the consumer runs (same fold policy, same vocoder), and
checks that every decode window appears exactly once on the audio topic, byte-identical.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

from confluent_kafka.admin import AdminClient

from codeclog.config import TopicsConfig
from consumers.fold.machine import FoldConfig, Policy
from consumers.pipeline import AudioPipeline, PipelineConfig, VocoderEngine
from consumers.service import read_partition
from schemas import wire
from schemas.records import AudioChunk, DeadLetter

WindowKey = tuple[str, int, int]  # request id, cache epoch, window index


@dataclasses.dataclass
class VerifyReport:
    expected_windows: int = 0
    actual_windows: int = 0
    missing: list[WindowKey] = dataclasses.field(default_factory=list)
    duplicated: list[WindowKey] = dataclasses.field(default_factory=list)
    unexpected: list[WindowKey] = dataclasses.field(default_factory=list)
    mismatched: list[WindowKey] = dataclasses.field(default_factory=list)
    requests: int = 0
    dead_letters: dict[str, int] = dataclasses.field(default_factory=dict)
    request_sha256: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.unexpected or self.mismatched)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["ok"] = self.ok
        return data


def partitions_of(client_config: dict[str, str], topic: str) -> list[int]:
    # Whole-cluster metadata: asking for one topic would auto-create it on brokers that allow it.
    metadata = AdminClient(dict(client_config)).list_topics(timeout=30)
    info = metadata.topics.get(topic)
    if info is None or info.error is not None:
        return []
    return sorted(info.partitions)


def expected_audio(
    client_config: dict[str, str],
    topics: TopicsConfig,
    engine: VocoderEngine,
    policy: Policy,
    progress: Callable[[str], None] | None = None,
) -> AudioPipeline:
    """Replay the whole chunk topic offline, partition by partition."""
    config = PipelineConfig(fold=FoldConfig(policy=policy), per_partition=True, record_audio=True)
    pipeline = AudioPipeline(config, engine)
    for partition in partitions_of(client_config, topics.chunks):
        records = read_partition(client_config, topics.chunks, partition, 0, None)
        if progress:
            progress(f"replaying {topics.chunks}[{partition}]: {len(records)} records")
        for start in range(0, len(records), 256):
            pipeline.step(records[start : start + 256])
    return pipeline


def actual_audio(
    client_config: dict[str, str], topics: TopicsConfig
) -> tuple[dict[WindowKey, list[str]], dict[str, int]]:
    windows: dict[WindowKey, list[str]] = collections.defaultdict(list)
    for partition in partitions_of(client_config, topics.audio):
        for record in read_partition(client_config, topics.audio, partition, 0, None):
            chunk = wire.decode(record.value)
            if isinstance(chunk, AudioChunk):
                key = (chunk.request_id, chunk.cache_epoch, chunk.window_index)
                windows[key].append(chunk.sha256)
    reasons: dict[str, int] = collections.Counter()
    for partition in partitions_of(client_config, topics.dlq):
        for record in read_partition(client_config, topics.dlq, partition, 0, None):
            letter = wire.decode(record.value)
            if isinstance(letter, DeadLetter):
                reasons[letter.reason] += 1
    return windows, dict(reasons)


def verify(
    client_config: dict[str, str],
    topics: TopicsConfig,
    engine: VocoderEngine,
    policy: Policy = Policy.TOLERANT,
    progress: Callable[[str], None] | None = None,
) -> VerifyReport:
    pipeline = expected_audio(client_config, topics, engine, policy, progress)
    expected: dict[WindowKey, str] = {}
    report = VerifyReport()
    for rid, audio in pipeline.audio.items():
        report.request_sha256[rid] = audio.hasher.hexdigest()
        for window in audio.windows:
            expected[(rid, window["cache_epoch"], window["window_index"])] = window["sha256"]
    actual, report.dead_letters = actual_audio(client_config, topics)
    report.requests = len(pipeline.audio)
    report.expected_windows = len(expected)
    report.actual_windows = sum(len(v) for v in actual.values())
    for key, sha in sorted(expected.items()):
        seen = actual.get(key, [])
        if not seen:
            report.missing.append(key)
        elif len(seen) > 1:
            report.duplicated.append(key)
        elif seen[0] != sha:
            report.mismatched.append(key)
    report.unexpected = sorted(key for key in actual if key not in expected)
    return report
