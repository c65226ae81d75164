"""Least-privilege ACLs for the codeclog roles, and applying them with the Admin API.
Why each grant: docs/security.md, "Roles and ACLs"."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping

from codeclog.errors import CodeclogError
from codeclog.kafka.log import client_settings
from codeclog.topics_config import TopicsConfig

DEFAULT_GROUP = "codeclog-vocoder"
DEFAULT_REPLAY_PREFIX = "codec.replay."
REPLAY_GROUPS = (
    "codeclog-capture",
    "codeclog-reader",
    "codeclog-listener",
    "codeclog-demo-listener",
)
REPLAY_GROUP_PREFIX = "codeclog-capture-"  # capture --group-less
CLUSTER = "kafka-cluster"


class AclError(CodeclogError):
    """ACLs could not be created or listed."""


class Resource(enum.Enum):
    TOPIC = "TOPIC"
    GROUP = "GROUP"
    TRANSACTIONAL_ID = "TRANSACTIONAL_ID"
    CLUSTER = "BROKER"  # confluent-kafka's ResourceType name for the cluster resource


class Pattern(enum.Enum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


@dataclasses.dataclass(frozen=True, order=True)
class AclSpec:
    """One ALLOW binding: principal may `operation` on `resource` `name`."""

    user: str
    operation: str  # READ, WRITE, DESCRIBE, IDEMPOTENT_WRITE
    resource: Resource
    name: str
    pattern: Pattern = Pattern.LITERAL

    @property
    def principal(self) -> str:
        return f"User:{self.user}"

    def describe(self) -> str:
        prefix = "prefix " if self.pattern is Pattern.PREFIXED else ""
        return f"{self.principal} {self.operation} {self.resource.name} {prefix}{self.name}"


def role_acls(
    topics: TopicsConfig,
    group: str = DEFAULT_GROUP,
    replay_prefix: str = DEFAULT_REPLAY_PREFIX,
    monitor_reads: bool = False,
    users: Mapping[str, str] | None = None,
) -> tuple[AclSpec, ...]:
    """Every grant of the four roles. `users` renames roles (role -> user name)."""
    name = {role: role for role in ("talker", "vocoder", "monitor", "replay")}
    name.update(users or {})
    topic, group_r, txn = Resource.TOPIC, Resource.GROUP, Resource.TRANSACTIONAL_ID
    talker, vocoder, monitor, replay = (name[r] for r in ("talker", "vocoder", "monitor", "replay"))
    all_topics = (topics.chunks, topics.audio, topics.live, topics.dlq, topics.progress)
    specs = [
        AclSpec(talker, "WRITE", topic, topics.chunks),
        AclSpec(talker, "DESCRIBE", topic, topics.chunks),
        AclSpec(talker, "IDEMPOTENT_WRITE", Resource.CLUSTER, CLUSTER),
        AclSpec(vocoder, "READ", topic, topics.chunks),
        AclSpec(vocoder, "DESCRIBE", topic, topics.chunks),
        AclSpec(vocoder, "READ", group_r, group),
        AclSpec(vocoder, "READ", topic, topics.progress),
        *(
            AclSpec(vocoder, op, topic, t)
            for t in (topics.audio, topics.live, topics.dlq, topics.progress)
            for op in ("WRITE", "DESCRIBE")
        ),
        AclSpec(vocoder, "WRITE", txn, f"{group}-", Pattern.PREFIXED),
        AclSpec(vocoder, "DESCRIBE", txn, f"{group}-", Pattern.PREFIXED),
        AclSpec(monitor, "DESCRIBE", group_r, group),
        *(AclSpec(monitor, "DESCRIBE", topic, t) for t in all_topics),
        *(AclSpec(replay, op, topic, t) for t in all_topics for op in ("READ", "DESCRIBE")),
        *(AclSpec(replay, "READ", group_r, g) for g in REPLAY_GROUPS),
        AclSpec(replay, "READ", group_r, REPLAY_GROUP_PREFIX, Pattern.PREFIXED),
        AclSpec(replay, "DESCRIBE", group_r, group),
    ]
    if monitor_reads:
        specs.append(AclSpec(monitor, "READ", topic, topics.chunks))
    if replay_prefix:
        specs += [
            AclSpec(replay, op, topic, replay_prefix, Pattern.PREFIXED)
            for op in ("WRITE", "DESCRIBE")
        ]
        specs.append(AclSpec(replay, "IDEMPOTENT_WRITE", Resource.CLUSTER, CLUSTER))
    return tuple(specs)


def acl_table(specs: Iterable[AclSpec]) -> str:
    """A plain-text table, one grant per line, for `acls apply` output and the README."""
    rows = [("PRINCIPAL", "OPERATION", "RESOURCE", "PATTERN", "NAME")]
    rows += [(s.principal, s.operation, s.resource.name, s.pattern.value, s.name) for s in specs]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def apply_acls(
    admin_config: Mapping[str, str], specs: Iterable[AclSpec], timeout_s: float = 30.0
) -> int:
    """Create every binding (existing ones stay as they are); returns how many were sent."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    specs_list = list(specs)
    bindings = [
        AclBinding(
            ResourceType[s.resource.value],
            s.name,
            ResourcePatternType[s.pattern.value],
            s.principal,
            "*",
            AclOperation[s.operation],
            AclPermissionType.ALLOW,
        )
        for s in specs_list
    ]
    admin = AdminClient(client_settings(admin_config, {"log_level": "2"}))
    futures = admin.create_acls(bindings, request_timeout=timeout_s)
    for spec, (_binding, future) in zip(specs_list, futures.items(), strict=True):
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            error = exc.args[0]
            text = error.str() if hasattr(error, "str") else str(error)
            raise AclError(
                f"creating the ACL {spec.describe()} failed: {text} (ACLs need a principal "
                "allowed to ALTER the cluster, e.g. the local broker's admin.properties)"
            ) from exc
        except TimeoutError as exc:
            raise AclError(
                f"the cluster did not answer CreateAcls within {timeout_s:.0f} s"
            ) from exc
    return len(bindings)
