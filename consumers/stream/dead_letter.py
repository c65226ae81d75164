"""Dead letters: a refused input record, with why, bounded so that it always fits its topic."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from codeclog.kafka.records import InputRecord
from codeclog.schemas.records import DeadLetter

# A dead letter must always fit the dead-letter topic (the broker's default max.message.bytes
# is 1 MiB, and a refused input can be just under it): a raw value and key up to this many
# bytes are kept whole; beyond, a prefix of DEAD_LETTER_PREFIX_BYTES is kept, with the size and
# SHA-256 of the whole (raw_value_truncated). Text fields are cut to DEAD_LETTER_TEXT_CHARS.
# The consumer lowers the limit to the dead-letter topic's own max.message.bytes minus
# DEAD_LETTER_HEADROOM_BYTES when that is smaller (PipelineConfig.dead_letter_raw_limit).
DEAD_LETTER_RAW_LIMIT = 900_000
DEAD_LETTER_HEADROOM_BYTES = 64 * 1024  # metadata, cut texts and key, batch overhead
DEAD_LETTER_PREFIX_BYTES = 64 * 1024
DEAD_LETTER_KEY_BYTES = 4096
DEAD_LETTER_TEXT_CHARS = 8192


def dead_letter(
    record: InputRecord,
    reason: str,
    details: dict[str, Any],
    error: str,
    request_id: str | None,
    *,
    raw_limit: int,
    at_ms: int,
    producer_id: str,
) -> DeadLetter:
    """The dead letter of `record`; `request_id` defaults to its key. A raw value and key over
    `raw_limit` bytes together keep a prefix only."""
    if request_id is None and record.key is not None:
        request_id = record.key.decode("utf-8", "replace")
    value, key = record.value, record.key
    truncated = len(value) + len(key or b"") > raw_limit
    if key is not None and len(key) > DEAD_LETTER_KEY_BYTES:
        details = {**details, "raw_key_size": len(key), "raw_key_truncated": True}
        key = key[:DEAD_LETTER_KEY_BYTES]
    text = json.dumps(details, sort_keys=True, separators=(",", ":"), default=str)
    if len(text) > DEAD_LETTER_TEXT_CHARS:
        text = json.dumps({"truncated_details": cut(text, DEAD_LETTER_TEXT_CHARS - 64)})
    return DeadLetter(
        reason=reason,
        source_topic=record.position.topic,
        source_partition=record.position.partition,
        source_offset=record.position.offset,
        raw_value=value[: min(DEAD_LETTER_PREFIX_BYTES, raw_limit)] if truncated else value,
        raw_key=key,
        request_id=None if request_id is None else cut(request_id, DEAD_LETTER_KEY_BYTES),
        cache_epoch=_int_or_none(details.get("cache_epoch")),
        chunk_seq=_int_or_none(details.get("chunk_seq")),
        details_json=text,
        error=cut(error, DEAD_LETTER_TEXT_CHARS),
        dead_lettered_at_ms=at_ms,
        producer_id=producer_id,
        raw_value_truncated=truncated,
        raw_value_size=len(value),
        raw_value_sha256=hashlib.sha256(value).hexdigest(),
    )


def cut(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
