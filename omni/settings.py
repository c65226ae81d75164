"""The connector's settings: the edge's `extra` dict of the deploy YAML, read once.
The keys: docs/vllm-omni.md, "Mode 1"."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

DEFAULT_TOPIC = "codec.chunks"
DEFAULT_IDLE_S = 600.0  # a request nobody asked for, with nothing read for this long, is dropped
DEFAULT_WAIT_S = 60.0  # a request the adapter waits on gets nothing for this long: it fails
REPLICA_ENV = "VLLM_OMNI_REPLICA_ID"  # set by vllm-omni in every stage engine process


@dataclasses.dataclass(frozen=True)
class ConnectorSettings:
    """Everything the connector reads from its config: the edge's `extra` dict, read once, with
    the `stage_id` and `role` vllm-omni adds (docs/vllm-omni.md, "Mode 1", its config keys)."""

    stage_id: Any  # an int as vllm-omni passes it (the adapter computes stage_id - 1)
    role: str  # "sender", "receiver" or "dual"
    client: dict[str, str]  # librdkafka properties: bootstrap.servers and the `kafka` extras
    topic: str
    replica_id: int
    group_id: str
    # static group membership: a replacement under the same replica identity takes over at once;
    # the topic is part of it, so two deployments sharing a group name never fence each other
    instance_id: str
    codec_edge: bool | None
    producer_id: str
    delivery_timeout_s: float
    linger_ms: float
    index_max_entries: int
    idle_s: float
    wait_s: float  # request_wait_s; 0 disables the bound

    @property
    def receives(self) -> bool:
        return self.role != "sender"


def read_settings(config: Mapping[str, Any]) -> ConnectorSettings:
    """The settings of a connector built with `config` (the edge's extra, plus stage and role)."""
    stage_id = _stage_id(config.get("stage_id", -1))
    bootstrap = config.get("bootstrap") or config.get("bootstrap.servers")
    bootstrap = bootstrap or os.environ.get("CODECLOG_BOOTSTRAP", "127.0.0.1:9092")
    replica_id = _replica_id(config)
    group_id = _group_id(config, stage_id, replica_id)
    topic = str(config.get("topic", DEFAULT_TOPIC))
    return ConnectorSettings(
        stage_id=stage_id,
        role=str(config.get("role", "dual")),
        client={
            "bootstrap.servers": str(bootstrap),
            **{str(k): str(v) for k, v in dict(config.get("kafka") or {}).items()},
        },
        topic=topic,
        replica_id=replica_id,
        group_id=group_id,
        instance_id=str(config.get("instance_id") or f"{group_id}-{topic}"),
        codec_edge=_codec_edge(config),
        producer_id=str(config.get("producer_id") or f"omni-{os.getpid()}"),
        delivery_timeout_s=float(config.get("delivery_timeout_ms", 30_000)) / 1000.0,
        linger_ms=float(config.get("linger_ms", 0)),
        index_max_entries=int(config.get("index_max_entries", 100_000)),
        idle_s=float(config.get("request_idle_s", DEFAULT_IDLE_S)),
        wait_s=float(config.get("request_wait_s", DEFAULT_WAIT_S)),
    )


def _stage_id(value: Any) -> Any:
    """The stage id as vllm-omni keeps it: an int (the chunk adapter computes stage_id - 1)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


def _replica_id(config: Mapping[str, Any]) -> int:
    """Which replica of its stage this process is: `replica_id` in the config, else the
    VLLM_OMNI_REPLICA_ID vllm-omni sets in every stage engine process, else 0."""
    raw = config.get("replica_id", os.environ.get(REPLICA_ENV, "0"))
    try:
        return max(int(raw), 0)
    except (TypeError, ValueError):
        return 0


def _group_id(config: Mapping[str, Any], stage_id: Any, replica_id: int) -> str:
    """The receiver's consumer group: one per replica, so each reads every partition and hands
    out the keys of the requests vllm-omni routed to it. `{replica}` in `group_id` places the
    replica id; without it, `-replica<N>` is appended."""
    stage = f"-stage{stage_id}" if isinstance(stage_id, int) and stage_id >= 0 else ""
    base = str(config.get("group_id") or f"codeclog-omni{stage}")
    if "{replica}" in base:
        return base.replace("{replica}", str(replica_id))
    return f"{base}-replica{replica_id}"


def _codec_edge(config: Mapping[str, Any]) -> bool | None:
    """Whether this edge is MiniCPM-o's talker -> Code2Wav (omni.payload): `codec_edge` in the
    config, else True where the config carries the codec windowing the MiniCPM-o processor
    reads from it (`codec_chunk_frames`), else None: decided per payload."""
    explicit = config.get("codec_edge")
    if explicit is not None:
        return str(explicit).lower() in ("1", "true", "yes")
    return True if "codec_chunk_frames" in config else None
