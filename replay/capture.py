"""Capture a topic (or some of its partitions and keys) from the log into a capture file.
How it reads, and why: docs/replay.md, "Capture"."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import importlib.metadata
import json
import platform
import subprocess
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from codeclog.kafka.access import raise_if_topic_refused, refusal
from codeclog.kafka.log import client_settings
from codeclog.replay.capture_drain import Drainer, Progress, ReadRefused
from codeclog.replay.capture_format import (
    CapturedRecord,
    CaptureFile,
    CaptureMetadata,
    PartitionSpan,
)
from codeclog.replay.errors import BoundError, CaptureError
from codeclog.version import __version__

ISOLATION_LEVEL = "read_committed"
DEFAULT_GROUP_ID = "codeclog-capture"


class BoundKind(enum.Enum):
    OFFSET = "offset"  # a Kafka offset, the same on every captured partition
    TIME_MS = "time_ms"  # a record timestamp (Unix ms): the first offset at or after it


@dataclasses.dataclass(frozen=True, slots=True)
class Bound:
    """A --from / --until value."""

    kind: BoundKind
    value: int


def parse_bound(text: str) -> Bound:
    """`1234` is an offset, `1767225600000ms` Unix milliseconds, anything else an ISO-8601 time.

    ISO times without a zone are UTC (a capture must not depend on the operator's TZ).
    """
    raw = text.strip()
    if raw.isdigit():
        return Bound(BoundKind.OFFSET, int(raw))
    if raw.endswith("ms") and raw[:-2].isdigit():
        return Bound(BoundKind.TIME_MS, int(raw[:-2]))
    try:
        moment = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise BoundError(
            f"{text!r} is not an offset (1234), Unix milliseconds (1767225600000ms) "
            "or an ISO time (2026-01-01T12:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return Bound(BoundKind.TIME_MS, int(moment.timestamp() * 1000))


@dataclasses.dataclass(frozen=True)
class CaptureSpec:
    """What to capture. `partitions` None means every partition of the topic."""

    topic: str
    partitions: tuple[int, ...] | None = None
    start: Bound | None = None
    until: Bound | None = None
    requests: tuple[str, ...] = ()  # keep only these keys (UTF-8); empty keeps all
    group_id: str = DEFAULT_GROUP_ID
    batch_size: int = 1000  # records per consume() call and per flushed file block
    timeout_s: float = 15.0  # per metadata / offsets request
    idle_timeout_s: float = 30.0  # give up when no partition advances for this long


@dataclasses.dataclass(frozen=True)
class CaptureSummary:
    records_read: int  # committed records consumed within the spans
    records_written: int  # after the request filter
    spans: tuple[PartitionSpan, ...]
    metadata: CaptureMetadata


def quiet_config(client_config: Mapping[str, str]) -> dict[str, Any]:
    """The user's properties, with librdkafka's per-retry log lines off unless they set
    log_level: failures surface as one clear error sentence instead."""
    return client_settings({"log_level": "2"}, client_config)


def consumer_config(client_config: Mapping[str, str], group_id: str) -> dict[str, Any]:
    """A read_committed, never-committing consumer; positions come only from assign()."""
    config = quiet_config(client_config)
    config.update(
        {
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": ISOLATION_LEVEL,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        }
    )
    return config


def throwaway_group_id() -> str:
    """For --group-less: a group name nobody else uses (nothing is ever committed under it)."""
    return f"codeclog-capture-{uuid.uuid4().hex}"


def plan_spans(
    partitions: Sequence[int],
    earliest: Mapping[int, int],
    latest: Mapping[int, int],
    start_offsets: Mapping[int, int] | None,
    until_offsets: Mapping[int, int] | None,
) -> tuple[PartitionSpan, ...]:
    """[start, end) per partition, clamped to what the log holds now (end <= LSO at start)."""
    spans = []
    for p in sorted(partitions):
        start = earliest[p] if start_offsets is None else max(start_offsets[p], earliest[p])
        end = latest[p] if until_offsets is None else min(until_offsets[p], latest[p])
        spans.append(PartitionSpan(p, start, max(start, end)))
    return tuple(spans)


def bound_offsets(
    bound: Bound | None,
    partitions: Sequence[int],
    latest: Mapping[int, int],
    offsets_for_time: Callable[[int], Mapping[int, int]],
) -> dict[int, int] | None:
    """Offsets per partition for a bound; a time past the last record maps to the LSO."""
    if bound is None:
        return None
    if bound.kind is BoundKind.OFFSET:
        return {p: bound.value for p in partitions}
    found = offsets_for_time(bound.value)
    return {p: found[p] if found.get(p, -1) >= 0 else latest[p] for p in partitions}


def key_filter(requests: Sequence[str]) -> Callable[[CapturedRecord], bool]:
    wanted = {r.encode() for r in requests}
    if not wanted:
        return lambda record: True
    return lambda record: record.key in wanted


class _TopicMissing(CaptureError):
    """The topic is not in the cluster metadata (missing, or hidden from this principal)."""


def git_commit(cwd: Path | None = None) -> str:
    """`git rev-parse HEAD` of the codeclog source tree, or "unknown" (e.g. an installed wheel)."""
    where = cwd or Path(__file__).resolve().parent
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = result.stdout.strip()
    return commit if result.returncode == 0 and commit else "unknown"


def client_versions() -> dict[str, str]:
    """The full version strings of the libraries that read the records (confluent_kafka's
    version() is a string on 2.x, so indexing it kept its first character: "2")."""
    import confluent_kafka
    import fastavro

    return {
        "confluent_kafka": importlib.metadata.version("confluent-kafka"),
        "fastavro": fastavro.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "python": platform.python_version(),
    }


def schema_fingerprints() -> dict[str, str]:
    from codeclog.schemas.catalog import known_fingerprints

    return dict(known_fingerprints())


@dataclasses.dataclass(frozen=True)
class _TopicFacts:
    cluster_id: str
    partition_count: int
    earliest: dict[int, int]
    latest: dict[int, int]


def _describe(admin: Any, spec: CaptureSpec) -> _TopicFacts:
    # Whole-cluster metadata: a request naming a missing topic could auto-create it (the admin
    # client is a producer underneath, and producers allow auto-creation by default).
    metadata = admin.list_topics(timeout=spec.timeout_s)
    topic = metadata.topics.get(spec.topic)
    if topic is None or topic.error is not None or not topic.partitions:
        raise _TopicMissing(f"topic {spec.topic!r} does not exist on the cluster")
    count = len(topic.partitions)
    partitions = _chosen_partitions(spec, count)
    earliest = _list_offsets(admin, spec, partitions, latest=False)
    latest = _list_offsets(admin, spec, partitions, latest=True)
    return _TopicFacts(str(metadata.cluster_id or "unknown"), count, earliest, latest)


def _chosen_partitions(spec: CaptureSpec, count: int) -> list[int]:
    if spec.partitions is None:
        return list(range(count))
    missing = [p for p in spec.partitions if not 0 <= p < count]
    if missing:
        raise CaptureError(
            f"topic {spec.topic!r} has partitions 0..{count - 1}; there is no partition "
            f"{missing[0]}"
        )
    return sorted(set(spec.partitions))


def _list_offsets(
    admin: Any, spec: CaptureSpec, partitions: Iterable[int], latest: bool
) -> dict[int, int]:
    """Earliest offsets, or end offsets as a read_committed consumer sees them (the LSO)."""
    from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    which = OffsetSpec.latest() if latest else OffsetSpec.earliest()
    request = {TopicPartition(spec.topic, p): which for p in partitions}
    futures = admin.list_offsets(
        request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=spec.timeout_s
    )
    try:
        return {tp.partition: int(f.result().offset) for tp, f in futures.items()}
    except KafkaException as exc:
        raise CaptureError(f"cannot list offsets of {spec.topic!r}: {exc.args[0].str()}") from exc


def _offsets_for_time(consumer: Any, spec: CaptureSpec, partitions: Sequence[int]) -> Any:
    from confluent_kafka import TopicPartition

    def lookup(ts_ms: int) -> dict[int, int]:
        asked = [TopicPartition(spec.topic, p, ts_ms) for p in partitions]
        found = consumer.offsets_for_times(asked, timeout=spec.timeout_s)
        return {tp.partition: int(tp.offset) for tp in found}

    return lookup


def plan_capture(consumer: Any, spec: CaptureSpec, facts: _TopicFacts) -> tuple[PartitionSpan, ...]:
    partitions = sorted(facts.latest)
    lookup = _offsets_for_time(consumer, spec, partitions)
    starts = bound_offsets(spec.start, partitions, facts.latest, lookup)
    untils = bound_offsets(spec.until, partitions, facts.latest, lookup)
    return plan_spans(partitions, facts.earliest, facts.latest, starts, untils)


def build_metadata(
    spec: CaptureSpec, facts: _TopicFacts, spans: tuple[PartitionSpan, ...], now_ms: int
) -> CaptureMetadata:
    return CaptureMetadata(
        topic=spec.topic,
        partition_count=facts.partition_count,
        spans=spans,
        cluster_id=facts.cluster_id,
        created_at_ms=now_ms,
        isolation_level=ISOLATION_LEVEL,
        codeclog_version=__version__,
        git_commit=git_commit(),
        schema_fingerprints=schema_fingerprints(),
        request_filter=tuple(spec.requests),
        client_versions=client_versions(),
    )


def run_capture(
    client_config: Mapping[str, str],
    spec: CaptureSpec,
    out_path: str | Path,
    clock_ms: Callable[[], int],
    monotonic: Callable[[], float],
    progress: Progress | None = None,
) -> CaptureSummary:
    """Capture `spec` from the cluster into `out_path`; the file is complete when this returns."""
    from confluent_kafka import Consumer, KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        admin = AdminClient(quiet_config(client_config))
        consumer = Consumer(consumer_config(client_config, spec.group_id))
    except KafkaException as exc:
        raise CaptureError(f"cannot create a Kafka client: {exc.args[0].str()}") from exc
    doing = {"group": f"READ group {spec.group_id}", "topic": f"READ topic {spec.topic}"}
    try:
        return _capture_with(admin, consumer, spec, out_path, clock_ms, monotonic, progress)
    except ReadRefused as exc:
        refused = refusal(exc.error, client_config, doing)
        assert refused is not None
        raise refused from None
    except _TopicMissing:
        raise_if_topic_refused(client_config, spec.topic, spec.timeout_s)
        raise
    except KafkaException as exc:
        if (refused := refusal(exc, client_config, doing)) is not None:
            raise refused from exc
        raise CaptureError(f"the capture failed: {exc.args[0].str()}") from exc
    finally:
        consumer.close()


def _capture_with(
    admin: Any,
    consumer: Any,
    spec: CaptureSpec,
    out_path: str | Path,
    clock_ms: Callable[[], int],
    monotonic: Callable[[], float],
    progress: Progress | None,
) -> CaptureSummary:
    facts = _describe(admin, spec)
    spans = plan_capture(consumer, spec, facts)
    metadata = build_metadata(spec, facts, spans, clock_ms())
    with CaptureFile.create(out_path, metadata) as writer:
        drainer = Drainer(
            consumer,
            spec.topic,
            writer,
            key_filter(spec.requests),
            clock_ms,
            monotonic,
            progress,
            spec.batch_size,
            spec.idle_timeout_s,
        )
        read, written = drainer.run(spans)
    return CaptureSummary(read, written, spans, metadata)


def spans_json(spans: Sequence[PartitionSpan]) -> str:
    return json.dumps({str(s.partition): [s.start, s.end] for s in spans}, sort_keys=True)
