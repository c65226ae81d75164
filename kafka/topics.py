"""The codeclog topics: what they must look like, creating them idempotently, listing them.
Reasons: README, "Topics and configuration"; docs/lag.md, "Time lag is on the broker's clock"."""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource, NewTopic

from codeclog.errors import CodeclogError
from codeclog.kafka.log import client_settings
from codeclog.topics_config import TopicsConfig

CLEANUP_POLICY = "cleanup.policy"
MIN_INSYNC_REPLICAS = "min.insync.replicas"
TIMESTAMP_TYPE = "message.timestamp.type"
LOG_APPEND_TIME = "LogAppendTime"
POLL_INTERVAL_S = 0.1
# The live topic is a transient copy (docs/listening.md): a listener needs it for seconds, the
# audio topic keeps the durable copy. Records go after 10 minutes (segments roll every 5).
LIVE_RETENTION = (("retention.ms", "600000"), ("segment.ms", "300000"))


class TopicsError(CodeclogError):
    """Topics could not be created, checked or listed."""


class ClusterUnreachableError(TopicsError):
    """No metadata from the cluster within the timeout."""


class TopicMismatchError(TopicsError):
    """Existing topics differ from the configuration; `problems` has one sentence each."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


class CleanupPolicy(enum.Enum):
    DELETE = "delete"  # records expire by retention
    COMPACT = "compact"  # the newest record per key is kept (checkpoints)


class TopicAction(enum.Enum):
    CREATED = "created"
    EXISTS = "exists"


@dataclasses.dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int  # the minimum acceptable count
    cleanup_policy: CleanupPolicy
    role: str  # what the topic carries, for humans
    settings: tuple[tuple[str, str], ...] = ()  # more topic configs a new topic gets


@dataclasses.dataclass(frozen=True)
class TopicInfo:
    """An existing topic as the cluster describes it."""

    name: str
    partitions: int
    replication_factor: int
    # cleanup.policy, min.insync.replicas, message.timestamp.type and every non-default config
    config: tuple[tuple[str, str], ...]

    def config_value(self, key: str) -> str | None:
        return dict(self.config).get(key)


@dataclasses.dataclass(frozen=True)
class TopicOutcome:
    spec: TopicSpec
    action: TopicAction
    replication_factor: int = 0  # what the topic has (0: not known)
    min_insync_replicas: int = 0  # the topic's min.insync.replicas (0: not known)
    brokers: int = 0  # how many brokers the cluster metadata listed
    notes: tuple[str, ...] = ()  # an existing topic's settings that differ (setting_notes)


def replication_for(brokers: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) for new topics on a cluster of `brokers`:
    3/2 on three or more (one broker may fail while acks=all writes still succeed), 1/1 on one
    (2/1 on two: a copy, but no write quorum to spare)."""
    if brokers >= 3:
        return 3, 2
    return max(brokers, 1), 1


def topic_specs(topics: TopicsConfig) -> tuple[TopicSpec, ...]:
    delete, compact = CleanupPolicy.DELETE, CleanupPolicy.COMPACT
    broker_time = ((TIMESTAMP_TYPE, LOG_APPEND_TIME),)  # time lag on the cluster's clock
    return (
        TopicSpec(
            topics.chunks,
            topics.partitions,
            delete,
            "codec chunks and control events",
            broker_time,
        ),
        TopicSpec(topics.audio, topics.partitions, delete, "decoded audio chunks"),
        TopicSpec(
            topics.live, topics.partitions, delete, "live copies of the audio", LIVE_RETENTION
        ),
        TopicSpec(topics.dlq, topics.dlq_partitions, delete, "dead letters"),
        TopicSpec(topics.progress, topics.partitions, compact, "per-request checkpoints"),
    )


def setting_notes(spec: TopicSpec, info: TopicInfo) -> list[str]:
    """What an existing topic lacks of the settings a new one gets: worth saying, not an error
    (the settings can be changed in place; codeclog does not alter existing topics)."""
    notes = []
    for key, value in spec.settings:
        found = info.config_value(key)
        if found is not None and found != value:
            notes.append(
                f"topic {spec.name} keeps {key}={found} (new topics get "
                f"{value}); set it with kafka-configs.sh --alter --entity-type topics "
                f"--entity-name {spec.name} --add-config {key}={value}"
            )
    return notes


def check_topic(spec: TopicSpec, info: TopicInfo) -> list[str]:
    """Why an existing topic does not fit its spec (empty when it fits)."""
    problems = []
    if info.partitions < spec.partitions:
        problems.append(
            f"topic {spec.name} exists with {info.partitions} partitions, fewer than the "
            f"{spec.partitions} configured (delete it, or set partitions in --topics-config)"
        )
    policy = info.config_value(CLEANUP_POLICY)
    if policy is not None and set(policy.split(",")) != {spec.cleanup_policy.value}:
        problems.append(
            f"topic {spec.name} exists with cleanup.policy={policy}, "
            f"but codeclog needs cleanup.policy={spec.cleanup_policy.value}"
        )
    return problems


def ensure_topics(
    client_config: dict[str, str], topics: TopicsConfig, timeout_s: float = 30
) -> None:
    """Create the codeclog topics that are missing; raise TopicMismatchError on misfits."""
    create_topics(client_config, topics, timeout_s)


def create_topics(
    client_config: Mapping[str, str],
    topics: TopicsConfig,
    timeout_s: float = 30,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[TopicOutcome, ...]:
    """Like ensure_topics, and tells which topics were created and which existed."""
    deadline = clock() + timeout_s
    admin = _admin(client_config)
    specs = topic_specs(topics)
    brokers = _broker_count(admin, timeout_s, client_config)
    replication, min_isr = replication_for(brokers)
    existing = _describe(admin, _topic_partitions(admin, timeout_s, client_config), timeout_s)
    missing = [spec for spec in specs if spec.name not in existing]
    raced = _create(admin, missing, timeout_s, replication, min_isr)
    if raced:
        existing = _describe(admin, _topic_partitions(admin, timeout_s, client_config), timeout_s)
    problems = [p for s in specs if s.name in existing for p in check_topic(s, existing[s.name])]
    if problems:
        raise TopicMismatchError(problems)
    created = [spec for spec in missing if spec.name not in raced]
    _wait_visible(admin, created, deadline, clock, client_config)
    outcomes = []
    for spec in specs:
        if spec in created:
            outcomes.append(TopicOutcome(spec, TopicAction.CREATED, replication, min_isr, brokers))
            continue
        info = existing[spec.name]
        isr = info.config_value(MIN_INSYNC_REPLICAS)
        outcomes.append(
            TopicOutcome(
                spec,
                TopicAction.EXISTS,
                info.replication_factor,
                int(isr) if isr and isr.isdigit() else 0,
                brokers,
                tuple(setting_notes(spec, info)),
            )
        )
    return tuple(outcomes)


def list_topics(
    client_config: Mapping[str, str], timeout_s: float = 30, include_internal: bool = False
) -> tuple[TopicInfo, ...]:
    """Every topic of the cluster (without `__*` internal ones unless asked), sorted by name."""
    admin = _admin(client_config)
    partitions = _topic_partitions(admin, timeout_s, client_config)
    if not include_internal:
        partitions = {n: p for n, p in partitions.items() if not n.startswith("__")}
    infos = _describe(admin, partitions, timeout_s)
    return tuple(infos[name] for name in sorted(infos))


def format_config(info: TopicInfo) -> str:
    return ", ".join(f"{key}={value}" for key, value in info.config) or "-"


# ----------------------------------------------------------------------------- admin calls


def _admin(client_config: Mapping[str, str]) -> AdminClient:
    # Failures come back as exceptions with one clear sentence; librdkafka's own per-retry
    # connection errors would bury it (the user's log_level, if any, wins).
    return AdminClient(client_settings({"log_level": "2"}, client_config))


def _cluster_metadata(
    admin: AdminClient, timeout_s: float, client_config: Mapping[str, str]
) -> ClusterMetadata:
    """The whole cluster's metadata; ClusterUnreachableError when it does not answer."""
    try:
        return admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise ClusterUnreachableError(
            f"no answer from the Kafka cluster at {client_config.get('bootstrap.servers')} "
            f"within {timeout_s:g} s ({_kafka_error_text(exc)}); is it running?"
        ) from exc


def _broker_count(admin: AdminClient, timeout_s: float, client_config: Mapping[str, str]) -> int:
    return len(_cluster_metadata(admin, timeout_s, client_config).brokers)


def _topic_partitions(
    admin: AdminClient, timeout_s: float, client_config: Mapping[str, str]
) -> dict[str, tuple[int, int]]:
    """name -> (partition count, replication factor) from one whole-cluster metadata call."""
    metadata = _cluster_metadata(admin, timeout_s, client_config)
    out: dict[str, tuple[int, int]] = {}
    for name, topic in metadata.topics.items():
        if topic.error is None:
            replicas = max((len(p.replicas) for p in topic.partitions.values()), default=0)
            out[name] = (len(topic.partitions), replicas)
    return out


def _describe(
    admin: AdminClient, partitions: Mapping[str, tuple[int, int]], timeout_s: float
) -> dict[str, TopicInfo]:
    if not partitions:
        return {}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in partitions]
    futures = admin.describe_configs(resources, request_timeout=timeout_s)
    infos = {}
    for resource, future in futures.items():
        name = resource.name
        config = _summarise_config(_result(future, f"describing topic {name}"))
        infos[name] = TopicInfo(name, partitions[name][0], partitions[name][1], config)
    return infos


def _summarise_config(entries: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    chosen = {
        key: str(entry.value)
        for key, entry in entries.items()
        if key in (CLEANUP_POLICY, MIN_INSYNC_REPLICAS, TIMESTAMP_TYPE) or not entry.is_default
    }
    return tuple(sorted(chosen.items()))


def _create(
    admin: AdminClient,
    specs: list[TopicSpec],
    timeout_s: float,
    replication: int,
    min_isr: int,
) -> set[str]:
    """Create topics; return the names someone else created meanwhile (TOPIC_ALREADY_EXISTS)."""
    if not specs:
        return set()
    new_topics = [
        NewTopic(
            spec.name,
            num_partitions=spec.partitions,
            replication_factor=replication,
            config={
                CLEANUP_POLICY: spec.cleanup_policy.value,
                MIN_INSYNC_REPLICAS: str(min_isr),
                **dict(spec.settings),
            },
        )
        for spec in specs
    ]
    futures = admin.create_topics(
        new_topics, operation_timeout=timeout_s, request_timeout=timeout_s
    )
    raced: set[str] = set()
    for name, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise TopicsError(
                    f"creating topic {name} failed: {_kafka_error_text(exc)}"
                ) from exc
            raced.add(name)
    return raced


def _wait_visible(
    admin: AdminClient,
    specs: list[TopicSpec],
    deadline: float,
    clock: Callable[[], float],
    client_config: Mapping[str, str],
) -> None:
    """Return once the broker's metadata shows the new topics with all their partitions."""
    while specs:
        remaining = max(deadline - clock(), POLL_INTERVAL_S)
        seen = _topic_partitions(admin, remaining, client_config)
        pending = [s.name for s in specs if seen.get(s.name, (0, 0))[0] < s.partitions]
        if not pending:
            return
        if clock() > deadline:
            raise TopicsError(f"created topics not visible in time: {', '.join(pending)}")
        time.sleep(POLL_INTERVAL_S)


def _result(future: Any, doing: str) -> Any:
    try:
        return future.result()
    except KafkaException as exc:
        raise TopicsError(f"{doing} failed: {_kafka_error_text(exc)}") from exc


def _kafka_error_text(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError):
        return str(error.str())
    return str(exc)
