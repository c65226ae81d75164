"""Errors of the vocoder package: narrow subclasses of the one codeclog base."""

from __future__ import annotations

import enum
from typing import TypeVar

from codeclog.errors import CodeclogError

Choice = TypeVar("Choice", bound=enum.Enum)


class VocoderError(CodeclogError):
    """Base of every error the vocoder raises on purpose."""


class VocoderConfigError(VocoderError):
    """A vocoder configuration is malformed, contradictory or has unknown keys."""


def parse_choice(kind: type[Choice], value: str | Choice, what: str) -> Choice:
    """`value` as a member of the option enum `kind` (a member passes as it is); a
    VocoderConfigError naming the choices when it is none of them."""
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        names = ", ".join(member.value for member in kind)
        raise VocoderConfigError(f"{what} must be one of {names}, got {value!r}") from None


class VocoderInputError(VocoderError):
    """A decode window the vocoder refuses: an id out of range, an empty window, a non-final
    window too short to hold its lookahead, or a state that cannot continue (finished, wrong
    engine). Raised before any compute, so no state has changed."""


class CheckpointError(VocoderError):
    """A checkpoint directory or fixture is missing files, or its weights do not fit the model."""


class StreamStateError(VocoderError):
    """Serialised stream state bytes are truncated, corrupt or of an unknown format version."""


class PortableKernelError(VocoderError):
    """An op without a portable kernel ran in portable mode."""
