"""Errors of the capture and replay tools (docs/replay.md; exit codes: README, "Exit codes")."""

from __future__ import annotations

from codeclog.errors import CodeclogError, UsageError


class ReplayError(CodeclogError):
    """Base of the capture, replay and diff errors; the message is one sentence for the user."""


class ReplayOptionError(ReplayError, UsageError):
    """Options that do not go together (e.g. --wav-dir without a vocoder)."""


class CaptureFormatError(ReplayError, UsageError):
    """A file is not a readable codeclog capture (wrong magic, schema or metadata)."""


class VocoderSpecError(ReplayError, UsageError):
    """--vocoder names no vocoder that loads (a missing or incomplete checkpoint, the vocoder
    extra not installed): configuration, exit 2, as `vocode` says for the same mistake."""


class InputFormatError(ReplayError, UsageError):
    """A replay or diff input is neither a capture, a JSONL scenario nor a replay report."""


class BoundError(ReplayError, UsageError):
    """A --from / --until value is neither an offset, an ISO time nor Unix milliseconds."""


class CaptureError(ReplayError):
    """Capturing from the cluster failed: missing topic, broker error, or no progress."""


class RepublishError(ReplayError):
    """Republishing a capture into a live topic failed."""
