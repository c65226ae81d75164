"""Errors of the flow: narrow subclasses of the vocoder's errors, each with a stable reason."""

from __future__ import annotations

import enum

from codeclog.vocoder.errors import VocoderConfigError, VocoderError, VocoderInputError


class FlowRejectReason(enum.Enum):
    """Why the flow refused a call. Values are stable: they end up in dead letters and metrics."""

    EMPTY_BATCH = "empty_batch"
    TOKEN_SHAPE = "token_shape"  # tokens are not a (B, T) integer tensor matching the states
    TOKEN_OUT_OF_RANGE = "token_out_of_range"
    CHUNK_BELOW_LOOKAHEAD_WINDOW = "chunk_below_lookahead_window"  # non-final T <= lookahead
    STATE_SIGNATURE_MISMATCH = "state_signature_mismatch"  # states cannot share one batch
    STREAM_FINISHED = "stream_finished"  # the state already decoded its final window
    NOISE_CAPACITY = "noise_capacity"  # the noise table is shorter than the cache + chunk
    POSITION_CAPACITY = "position_capacity"  # the rel-pos table is shorter than the cache + chunk
    BAD_PROMPT = "bad_prompt"  # prompt features of the wrong shape, dtype or length


class FlowInputError(VocoderInputError):
    """A call the flow refuses before any compute; no state changed."""

    def __init__(self, reason: FlowRejectReason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason


class FlowConfigError(VocoderConfigError):
    """A flow configuration (or flow.yaml) is malformed, contradictory or has unknown keys."""


class FlowStateError(VocoderError):
    """Serialised flow state bytes are truncated, corrupt or of an unknown format version."""
