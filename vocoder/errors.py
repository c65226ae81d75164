"""Errors of the vocoder package: narrow subclasses of the one codeclog base."""

from __future__ import annotations

from codeclog.errors import CodeclogError


class VocoderError(CodeclogError):
    """Base of every error the vocoder raises on purpose."""


class VocoderConfigError(VocoderError):
    """A vocoder configuration is malformed, contradictory or has unknown keys."""


class VocoderInputError(VocoderError):
    """A decode window the vocoder refuses: an id out of range, an empty window, a non-final
    window too short to hold its lookahead, or a state that cannot continue (finished, wrong
    engine). Raised before any compute, so no state has changed."""


class CheckpointError(VocoderError):
    """A checkpoint directory or fixture is missing files, or its weights do not fit the model."""


class StreamStateError(VocoderError):
    """Serialised stream state bytes are truncated, corrupt or of an unknown format version."""
