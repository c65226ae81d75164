"""The log's layout: codeclog's topic names and partition counts (`--topics-config`).
Reasons: README, "Architecture"."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from codeclog.errors import ConfigError
from codeclog.json_values import JsonValueError, json_object
from codeclog.user_files import read_text


@dataclasses.dataclass(frozen=True)
class TopicsConfig:
    """Topic names and partition counts. Every field is documented; unknown keys are errors."""

    chunks: str = "codec.chunks"  # codec chunks and control events, keyed by request id
    audio: str = "codec.audio"  # audio chunks, keyed by request id
    # The live copy of the audio (docs/listening.md): each window written once decoded, before
    # its transaction; short retention. Empty: the audio topic's name + ".live"
    live: str = ""
    dlq: str = "codec.dlq"  # dead letters: reason, position, details, raw bytes
    progress: str = "codec.progress"  # compacted: per-request recovery checkpoints
    partitions: int = 8  # partitions of the chunks, audio, live and progress topics
    dlq_partitions: int = 1

    def __post_init__(self) -> None:
        if not self.live:
            object.__setattr__(self, "live", live_topic_of(self.audio))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TopicsConfig:
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ConfigError(f"unknown topic config keys: {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for key, value in raw.items():
            expected = int if key.endswith("partitions") else str
            if not isinstance(value, expected) or isinstance(value, bool):
                raise ConfigError(f"topic config {key!r} must be {expected.__name__}")
            if isinstance(value, int) and value < 1:
                raise ConfigError(f"topic config {key!r} must be >= 1, got {value}")
            if expected is str and not value:
                raise ConfigError(f"topic config {key!r} must not be empty")
            values[key] = value
        config = cls(**values)
        names = [config.chunks, config.audio, config.live, config.dlq, config.progress]
        if len(set(names)) != len(names):
            raise ConfigError("topic names must be distinct")
        return config

    @classmethod
    def load(cls, path: str | Path | None) -> TopicsConfig:
        if path is None:
            return cls()
        text = read_text(path, "--topics-config")
        try:
            raw = json_object(text)
        except JsonValueError as exc:
            raise ConfigError(f"--topics-config {path}: {exc}") from None
        return cls.from_dict(raw)


def live_topic_of(audio: str) -> str:
    """The live topic's name when none is configured: beside the audio topic."""
    return f"{audio}.live"
