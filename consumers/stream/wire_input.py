"""An input record as a fold event, or why it is refused (its dead letter's reason and details).
Reasons: docs/operating.md, "Liveness bounds"."""

from __future__ import annotations

from typing import Any, NamedTuple

from codeclog.consumers.stream.dead_letter import cut
from codeclog.consumers.stream.fold.outcomes import RejectReason
from codeclog.consumers.stream.fold.rules import Event
from codeclog.kafka.records import InputRecord
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk, ControlEvent

KEY_MISMATCH = RejectReason.KEY_MISMATCH.value  # dead-letter reasons of the consumer's own,
MISSING_KEY = RejectReason.MISSING_KEY.value  # in the fold's one closed enum


class Refusal(NamedTuple):
    """Why an input record is refused: its dead letter's reason, details and error text."""

    reason: str
    details: dict[str, Any]
    error: str
    request_id: str | None = None


def decode_input(record: InputRecord) -> Event | Refusal:
    try:
        event = wire.decode(record.value)
    except wire.DecodeError as exc:
        details = {"decode_reason": exc.reason.value}
        return Refusal(RejectReason.UNDECODABLE_RECORD.value, details, str(exc))
    if not isinstance(event, CodecChunk | ControlEvent):
        details = {"decode_reason": "unexpected_record_type", "type": type(event).__name__}
        return Refusal(RejectReason.UNDECODABLE_RECORD.value, details, "")
    if record.key is None and event.request_id:
        details = {"request_id": event.request_id}
        return Refusal(MISSING_KEY, details, "the record has no key", event.request_id)
    if record.key is not None and record.key != event.request_id.encode():
        details = {"key": cut(record.key.decode("utf-8", "replace"), 256)}
        return Refusal(KEY_MISMATCH, details, "", event.request_id)
    return event
