"""Errors of the capture and replay tools. All derive from `codeclog.errors.CodeclogError`."""

from __future__ import annotations

from codeclog.errors import CodeclogError


class ReplayError(CodeclogError):
    """Base of the capture, replay and diff errors; the message is one sentence for the user."""


class CaptureFormatError(ReplayError):
    """A file is not a readable codeclog capture (wrong magic, schema or metadata)."""


class InputFormatError(ReplayError):
    """A replay or diff input is neither a capture, a JSONL scenario nor a replay report."""


class BoundError(ReplayError):
    """A --from / --until value is neither an offset, an ISO time nor Unix milliseconds."""


class CaptureError(ReplayError):
    """Capturing from the cluster failed: missing topic, broker error, or no progress."""


class RepublishError(ReplayError):
    """Republishing a capture into a live topic failed."""
