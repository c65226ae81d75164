"""Payloads <-> records, exactly: codec payloads as CodecChunk, everything else as an envelope."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from codeclog.omni.payload import (
    HEADER,
    PayloadError,
    decode_payload,
    encode_payload,
    is_codec_payload,
    minicpmo_payload,
    parse_put_key,
)
from codeclog.schemas import wire
from codeclog.schemas.records import PayloadEnvelope
from codeclog.testing.upstream_streams import preroll_window
from tests.omni.equality import payload_equal


def _round_trip(payload: object, key: str = "r_x_1_3") -> tuple[object, object]:
    encoded = encode_payload(payload, from_stage="1", to_stage="2", put_key=key, now_ms=5)
    decoded = decode_payload(encoded.value, encoded.headers)
    assert decoded is not None
    return encoded, decoded


CHUNK = preroll_window(
    "r_x",
    (1, 2, 3, 4),
    cache_epoch=1,
    chunk_seq=3,
    tts_is_last_chunk=True,
    duplex_epoch=2,
    duplex_turn_id=5,
    llm_output_text_utf8="héllo".encode(),
    ref_audio=np.arange(4, dtype="<f4").tobytes(),
    ref_audio_sr=16000,
)


def test_put_keys_split_from_the_right() -> None:
    assert parse_put_key("req_a_1_17") == ("req_a", "1", 17)
    assert parse_put_key("plain") == ("plain", None, None)
    assert parse_put_key("r_x_y") == ("r_x_y", None, None)


def test_a_codec_payload_is_a_codec_chunk_with_the_shape_in_a_header() -> None:
    payload = minicpmo_payload(CHUNK)
    assert is_codec_payload(payload)
    encoded, decoded = _round_trip(payload)
    assert encoded.record_type == "codec_chunk"  # type: ignore[attr-defined]
    record = wire.decode(encoded.value)  # type: ignore[attr-defined]
    assert record == dataclasses.replace(CHUNK, produced_at_ms=5)
    assert [name for name, _ in encoded.headers] == [HEADER]  # type: ignore[attr-defined]
    assert payload_equal(decoded.payload, payload)  # type: ignore[attr-defined]
    # the chunk's values are referenced, not repeated
    envelope = decoded.envelope  # type: ignore[attr-defined]
    assert {e.source for e in envelope.entries if e.source} >= {
        "codec_chunk.codes",
        "codec_chunk.chunk_seq",
        "codec_chunk.ref_audio",
        "codec_chunk.llm_output_text_utf8",
    }
    assert all(e.bytes_value is None for e in envelope.entries if e.source)


def test_codec_payload_variants_restore_exactly() -> None:
    payload = minicpmo_payload(CHUNK)
    payload["codes"]["audio"] = payload["codes"]["audio"].reshape(-1, 1).to(torch.int32)
    payload["meta"]["chunk_seq"] = torch.tensor([3])  # a tensor where an int is usual
    payload["meta"]["duplex_epoch"] = None  # "int or None" upstream
    payload["meta"]["cache_epoch"] = True  # the wrong type: kept inline, chunk default
    payload["meta"]["extra"] = {"nested": (1, [2.5, float("nan")]), "e": {}}
    _encoded, decoded = _round_trip(payload)
    assert payload_equal(decoded.payload["meta"]["extra"]["e"], {})  # type: ignore[attr-defined]
    restored = decoded.payload  # type: ignore[attr-defined]
    assert restored["codes"]["audio"].shape == (7, 1)
    assert restored["codes"]["audio"].dtype == torch.int32
    assert restored["meta"]["cache_epoch"] is True and restored["meta"]["duplex_epoch"] is None
    nan = restored["meta"]["extra"]["nested"][1][1]
    assert nan != nan
    restored["meta"]["extra"]["nested"][1][1] = payload["meta"]["extra"]["nested"][1][1] = 0.0
    assert payload_equal(restored, payload)
    chunk = decoded.chunk  # type: ignore[attr-defined]
    assert chunk.cache_epoch == 0 and chunk.chunk_seq == 3 and chunk.duplex_epoch == -1


def test_a_codec_payload_the_chunk_cannot_carry_goes_as_an_envelope() -> None:
    payload = minicpmo_payload(CHUNK)
    payload["codes"]["audio"] = torch.tensor([2**40], dtype=torch.int64)  # beyond Avro int
    encoded, decoded = _round_trip(payload)
    assert encoded.record_type == "payload_envelope"  # type: ignore[attr-defined]
    assert payload_equal(decoded.payload, payload)  # type: ignore[attr-defined]


def test_any_other_payload_is_a_typed_envelope() -> None:
    payload = {
        "hidden": torch.randn(2, 3).to(torch.bfloat16),
        "empty": torch.empty(0, 4, dtype=torch.float32),
        "scalar": torch.tensor(7, dtype=torch.int16),
        "mask": torch.tensor([True, False]),
        "np": np.arange(6, dtype=np.int32).reshape(2, 3),
        "list": [1, "a", None, b"\x00", (True, 1.5)],
        "ids": [],
    }
    encoded, decoded = _round_trip(payload, key="free-form key")
    assert isinstance(wire.decode(encoded.value), PayloadEnvelope)  # type: ignore[attr-defined]
    assert payload_equal(decoded.payload, payload)  # type: ignore[attr-defined]
    assert decoded.envelope.chunk_id is None  # type: ignore[attr-defined]
    assert payload_equal(_round_trip([1, 2])[1].payload, [1, 2])  # type: ignore[attr-defined]


def test_unsendable_payloads_are_refused_with_a_payload_error() -> None:
    for bad in ({"x": object()}, {1: "int key"}, {"big": 2**70}, np.array([object()])):
        with pytest.raises(PayloadError):
            encode_payload(bad, from_stage="1", to_stage="2", put_key="r_1_0")


def test_records_the_connector_did_not_write_are_not_payloads() -> None:
    assert decode_payload(wire.encode(CHUNK), []) is None  # a plain talker chunk, no header
