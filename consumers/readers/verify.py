"""The operator's oracle: is the audio topic exactly the offline replay of the input topic?
Reasons: docs/operating.md, "verify: the oracle"; comparisons: docs/determinism.md."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any, cast

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from codeclog.consumers.readers.audio_compare import Bound, Comparison, compare_bound, pcm_digest
from codeclog.consumers.stream.engine import VocoderEngine
from codeclog.consumers.stream.fold.state import FoldConfig, Policy
from codeclog.consumers.stream.limit import LimitOptions, StreamLimit
from codeclog.consumers.stream.pipeline import AudioPipeline, PipelineConfig
from codeclog.kafka.calls import ClusterUnavailableError, one_line
from codeclog.kafka.log import client_settings
from codeclog.kafka.reader import read_partition
from codeclog.schemas import wire
from codeclog.schemas.records import AudioChunk, DeadLetter
from codeclog.topics_config import TopicsConfig

WindowKey = tuple[str, int, int]  # request id, cache epoch, window index
METADATA_TIMEOUT_S = 10.0  # as the vocoder member's first metadata request


@dataclasses.dataclass
class VerifyReport:
    expected_windows: int = 0
    actual_windows: int = 0
    missing: list[WindowKey] = dataclasses.field(default_factory=list)
    duplicated: list[WindowKey] = dataclasses.field(default_factory=list)
    unexpected: list[WindowKey] = dataclasses.field(default_factory=list)
    mismatched: list[WindowKey] = dataclasses.field(default_factory=list)
    corrupt: list[WindowKey] = dataclasses.field(default_factory=list)  # pcm != its sha256
    requests: int = 0
    dead_letters: dict[str, int] = dataclasses.field(default_factory=dict)
    request_sha256: dict[str, str] = dataclasses.field(default_factory=dict)
    replay_domain: str = ""  # the determinism domain of the offline replay
    domains: dict[str, int] = dataclasses.field(default_factory=dict)  # audio windows by domain
    comparisons: dict[str, int] = dataclasses.field(default_factory=dict)  # bytes / bound
    worst_bound_lsb: int = 0  # the largest |difference| among windows compared by the bound
    bound: dict[str, float] = dataclasses.field(default_factory=dict)
    stream_limit: str = ""  # the open-stream limit the replay applied, as the members do

    @property
    def ok(self) -> bool:
        problems = (self.missing, self.duplicated, self.unexpected, self.mismatched, self.corrupt)
        return not any(problems)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["ok"] = self.ok
        return data


def partitions_of(
    client_config: dict[str, str], topic: str, timeout_s: float = METADATA_TIMEOUT_S
) -> list[int]:
    """The partitions of `topic` ([] when it does not exist); ClusterUnavailableError (one
    line, exit 1) when the cluster does not answer."""
    # Whole-cluster metadata: asking for one topic would auto-create it on brokers that allow it.
    admin = AdminClient(client_settings(client_config))
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise ClusterUnavailableError(
            f"no answer from the cluster at {client_config.get('bootstrap.servers')} within "
            f"{timeout_s:g} s ({one_line(exc)})"
        ) from exc
    info = metadata.topics.get(topic)
    if info is None or info.error is not None:
        return []
    return sorted(info.partitions)


@dataclasses.dataclass(frozen=True)
class AudioWindow:
    """One audio record as verify sees it."""

    sha256: str  # the record's own field
    rehash: str  # sha256 of its pcm_s16le, recomputed
    domain: str  # the determinism domain that wrote it ("" for v1 records: unknown)
    pcm: bytes


EngineFactory = Callable[[frozenset[str]], VocoderEngine]


def expected_audio(
    client_config: dict[str, str],
    topics: TopicsConfig,
    engine: VocoderEngine,
    policy: Policy,
    progress: Callable[[str], None] | None = None,
    keep_pcm: bool = False,
    limits: LimitOptions | None = None,
) -> tuple[AudioPipeline, StreamLimit]:
    """Replay the whole chunk topic offline, partition by partition, evicting as the members
    do under `limits` (consumers.stream.limit)."""
    partitions = partitions_of(client_config, topics.chunks)
    limit = (limits or LimitOptions()).resolve(max(1, len(partitions)), engine)
    fold = FoldConfig(policy=policy, max_open_streams=limit.per_partition)
    config = PipelineConfig(
        fold=fold,
        per_partition=True,
        record_audio=True,
        keep_pcm=keep_pcm,
        eviction_cause=limit.cause,
        report=False,  # verify compares audio; the fold report of a whole topic is not read
    )
    pipeline = AudioPipeline(config, engine)
    for partition in partitions:
        records = read_partition(client_config, topics.chunks, partition, 0, None)
        if progress:
            progress(f"replaying {topics.chunks}[{partition}]: {len(records)} records")
        for start in range(0, len(records), 256):
            pipeline.step(records[start : start + 256])
    return pipeline, limit


def actual_audio(
    client_config: dict[str, str], topics: TopicsConfig
) -> tuple[dict[WindowKey, list[AudioWindow]], dict[str, int]]:
    windows: dict[WindowKey, list[AudioWindow]] = collections.defaultdict(list)
    for partition in partitions_of(client_config, topics.audio):
        for record in read_partition(client_config, topics.audio, partition, 0, None):
            chunk = wire.decode(record.value)
            if isinstance(chunk, AudioChunk):
                key = (chunk.request_id, chunk.cache_epoch, chunk.window_index)
                pcm = chunk.pcm_s16le
                seen = AudioWindow(chunk.sha256, pcm_digest(pcm), chunk.determinism_domain, pcm)
                windows[key].append(seen)
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
    engine: VocoderEngine | EngineFactory,
    policy: Policy = Policy.TOLERANT,
    progress: Callable[[str], None] | None = None,
    bound: Bound | None = None,
    stream_limits: LimitOptions | None = None,
) -> VerifyReport:
    """`engine` is the replay's vocoder, or a factory given the domains on the audio topic;
    `stream_limits` the members' open-stream options (their evictions are replayed)."""
    limits = bound or Bound()
    actual, dead_letters = actual_audio(client_config, topics)
    domains = collections.Counter(w.domain for seen in actual.values() for w in seen)
    chosen = _resolve(engine, frozenset(domains))
    replay_domain = str(getattr(chosen, "domain", ""))
    foreign = any(domain != replay_domain for domain in domains)
    pipeline, limit = expected_audio(
        client_config, topics, chosen, policy, progress, keep_pcm=foreign, limits=stream_limits
    )
    report = VerifyReport(
        stream_limit=limit.describe(),
        dead_letters=dead_letters,
        replay_domain=replay_domain,
        domains=dict(sorted(domains.items())),
        bound={"max_abs_lsb": limits.max_abs_lsb, "min_snr_db": limits.min_snr_db},
    )
    expected = _expected_windows(pipeline, report)
    report.requests = len(pipeline.audio)
    report.expected_windows = len(expected)
    report.actual_windows = sum(len(v) for v in actual.values())
    comparisons: collections.Counter[str] = collections.Counter()
    for key, (sha, pcm) in sorted(expected.items()):
        seen = actual.get(key, [])
        if not seen:
            report.missing.append(key)
        elif len(seen) > 1:
            report.duplicated.append(key)
        elif not _matches(seen[0], sha, pcm, replay_domain, limits, report, comparisons):
            report.mismatched.append(key)
    report.corrupt = sorted(
        key for key, seen in actual.items() if any(w.rehash != w.sha256 for w in seen)
    )
    report.unexpected = sorted(key for key in actual if key not in expected)
    report.comparisons = dict(sorted(comparisons.items()))
    return report


def _resolve(engine: VocoderEngine | EngineFactory, domains: frozenset[str]) -> VocoderEngine:
    if hasattr(engine, "decode_batch"):
        return cast(VocoderEngine, engine)
    return engine(domains)


def _expected_windows(
    pipeline: AudioPipeline, report: VerifyReport
) -> dict[WindowKey, tuple[str, bytes]]:
    """(sha256, pcm) of every replayed window; pcm is empty unless the pipeline kept it."""
    expected: dict[WindowKey, tuple[str, bytes]] = {}
    for rid, audio in pipeline.audio.items():
        report.request_sha256[rid] = audio.hasher.hexdigest()
        pcm = bytes(audio.pcm or b"")
        start = 0
        for window in audio.windows:
            end = start + 2 * int(window["samples"])
            key = (rid, window["cache_epoch"], window["window_index"])
            expected[key] = (window["sha256"], pcm[start:end])
            start = end
    return expected


def _matches(
    seen: AudioWindow,
    sha: str,
    pcm: bytes,
    replay_domain: str,
    limits: Bound,
    report: VerifyReport,
    comparisons: collections.Counter[str],
) -> bool:
    """Bytes within the replay's domain; across domains equal bytes or the numeric bound."""
    if seen.domain == replay_domain or seen.rehash == sha:
        comparisons[Comparison.BYTES.value] += 1
        return seen.rehash == sha
    verdict = compare_bound(pcm, seen.pcm, limits)
    comparisons[Comparison.BOUND.value] += 1
    report.worst_bound_lsb = max(report.worst_bound_lsb, verdict.max_abs_lsb)
    return verdict.ok
