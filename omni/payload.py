"""vllm-omni stage payloads <-> Kafka records, shape for shape (`encode_payload`, `decode_payload`).
Reasons: docs/vllm-omni.md, "Mode 1"; docs/wire-format.md."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from codeclog.omni import minicpmo
from codeclog.omni.tree import PayloadError, flatten, plain, rebuild
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk, ControlEvent, PayloadEntry, PayloadEnvelope

HEADER = "codeclog.payload"  # the PayloadEnvelope header of a CodecChunk or ControlEvent value
RECORD_TYPES = {CodecChunk: "codec_chunk", ControlEvent: "control_event"}

__all__ = ["HEADER", "Decoded", "Encoded", "PayloadError", "decode_payload", "encode_payload"]


@dataclasses.dataclass(frozen=True, slots=True)
class Encoded:
    value: bytes
    headers: list[tuple[str, bytes]]
    record_type: str  # "codec_chunk", "control_event" or "payload_envelope"
    request_id: str  # the Kafka key

    @property
    def size(self) -> int:
        return len(self.value) + sum(len(v) for _, v in self.headers)


@dataclasses.dataclass(frozen=True, slots=True)
class Decoded:
    envelope: PayloadEnvelope
    payload: Any
    chunk: CodecChunk | None  # the record the payload rode on, if a CodecChunk
    terminal: bool  # `meta.finished`: the request's last payload


def parse_put_key(put_key: str) -> tuple[str, str | None, int | None]:
    """`{external_req_id}_{stage}_{chunk_id}` -> (request id, stage, chunk id).

    Another form gives (put_key, None, None).
    """
    parts = put_key.rsplit("_", 2)
    if len(parts) == 3 and parts[0] and parts[1].isdigit() and parts[2].isdigit():
        return parts[0], parts[1], int(parts[2])
    return put_key, None, None


def _typed_record(
    tree: Any, request_id: str, now_ms: int, producer_id: str, codec_edge: bool | None
) -> tuple[CodecChunk | ControlEvent, Any] | None:
    """The typed record of a payload and the nodes it carries, or None for an envelope."""
    if codec_edge is False:
        return None
    if minicpmo.has_codes(tree) and (codec_edge or minicpmo.is_codec_payload(tree)):
        return minicpmo.codec_record(tree, request_id, now_ms, producer_id)
    if codec_edge and not minicpmo.has_codes(tree):
        return minicpmo.end_marker(tree, request_id, now_ms, producer_id), None
    return None


def encode_payload(
    payload: Any,
    *,
    from_stage: str,
    to_stage: str,
    put_key: str,
    now_ms: int = 0,
    producer_id: str = "",
    codec_edge: bool | None = None,
) -> Encoded:
    """The Kafka value and headers of one put; PayloadError if the payload cannot be sent.

    `codec_edge`: True on the talker -> Code2Wav edge, False for envelopes only, None to decide
    per payload. On the codec edge a payload with `codes.audio` is a typed `CodecChunk` and one
    without is a `ControlEvent` FINISH (omni.minicpmo), each with a `PayloadEnvelope` in the
    `codeclog.payload` header holding the payload's shape; decided per payload, a payload is a
    CodecChunk when it is recognisably MiniCPM-o's (`codes.audio` and a stream position in
    `meta`); anything else is a `PayloadEnvelope` value."""
    request_id, _stage, chunk_id = parse_put_key(put_key)
    tree = plain(payload)

    def envelope(entries: tuple[PayloadEntry, ...]) -> PayloadEnvelope:
        return PayloadEnvelope(
            request_id, from_stage, to_stage, put_key, entries, chunk_id, now_ms, producer_id
        )

    typed = _typed_record(tree, request_id, now_ms, producer_id, codec_edge)
    if typed is not None:
        record, backed = typed
        try:
            value = wire.encode(record)
        except wire.EncodeError:
            value = b""  # a field the record cannot carry: the generic envelope then
        if value:
            entries = flatten(tree, backed) if backed is not None else flatten(tree)
            header = _encode(envelope(entries))
            return Encoded(value, [(HEADER, header)], RECORD_TYPES[type(record)], request_id)
    return Encoded(_encode(envelope(flatten(tree))), [], "payload_envelope", request_id)


def _encode(envelope: PayloadEnvelope) -> bytes:
    try:
        return wire.encode(envelope)
    except wire.EncodeError as exc:
        raise PayloadError(str(exc)) from exc


def decode_payload(
    value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None
) -> Decoded | None:
    """The payload of a record the connector wrote; None for other records (no envelope).

    Raises wire.DecodeError or PayloadError for a damaged record.
    """
    record = wire.decode(value)
    if isinstance(record, PayloadEnvelope):
        return _decoded(record, rebuild(record.entries), None)
    if not isinstance(record, CodecChunk | ControlEvent):
        return None
    raw = next((v for k, v in headers or () if k == HEADER), None)
    if raw is None:
        return None  # a plain codeclog record (e.g. from the talker hook): not a connector put
    envelope = wire.decode(raw)
    if not isinstance(envelope, PayloadEnvelope):
        raise PayloadError(f"the {HEADER} header holds a {type(envelope).__name__}")
    if isinstance(record, ControlEvent):
        return _decoded(envelope, rebuild(envelope.entries), None)
    return _decoded(envelope, rebuild(envelope.entries, minicpmo.chunk_resolver(record)), record)


def _decoded(envelope: PayloadEnvelope, payload: Any, chunk: CodecChunk | None) -> Decoded:
    return Decoded(envelope, payload, chunk, minicpmo.is_finished(payload))
