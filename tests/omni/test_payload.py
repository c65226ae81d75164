"""Payloads <-> records, exactly: codec payloads as CodecChunk, everything else as an envelope."""

from __future__ import annotations

import dataclasses
import json

import msgspec
import numpy as np
import pytest
import torch

from codeclog.omni.minicpmo import is_codec_payload, minicpmo_payload
from codeclog.omni.payload import (
    HEADER,
    PayloadError,
    decode_payload,
    encode_payload,
    parse_put_key,
)
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind, PayloadEnvelope
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


# vllm-omni's payload structs (vllm_omni.data_entry_keys), as they are declared: msgspec Structs
# that omit defaults, keyword-only, refusing unknown fields; a model's meta subclasses the base.
class _Struct(msgspec.Struct, omit_defaults=True, kw_only=True, forbid_unknown_fields=True):
    pass


class Codes(_Struct):
    audio: torch.Tensor | None = None
    ref: torch.Tensor | None = None


class Meta(_Struct):
    finished: torch.Tensor | None = None
    is_segment_finished: torch.Tensor | None = None
    request_id: str | None = None
    chunk_seq: int | None = None
    cache_epoch: int | None = None
    last_chunk: bool | None = None
    code_flat_numel: int | None = None
    omni_task: list[str] = []  # a factory default


class MiniCPMOMeta(Meta):
    duplex_epoch: int | None = None


class Payload(_Struct):
    hidden: torch.Tensor | None = None
    codes: Codes | None = None
    meta: Meta | None = None
    request_id: str | None = None


def _keys(tree: object) -> object:
    """The dict structure of a payload: keys all the way down, leaves as None."""
    return {k: _keys(v) for k, v in tree.items()} if isinstance(tree, dict) else None


def _msgspec_keys(struct: object) -> object:
    """The dict structure msgspec's own encoding gives a struct (what vllm-omni sends)."""
    return _keys(json.loads(msgspec.json.encode(struct, enc_hook=lambda _obj: None)))


def _encode(payload: object, codec_edge: bool | None = None) -> object:
    return encode_payload(
        payload, from_stage="1", to_stage="2", put_key="r_x_1_4", now_ms=5, codec_edge=codec_edge
    )


def test_a_struct_travels_as_the_dict_msgspec_encodes_it_without_its_defaults() -> None:
    ids = torch.tensor([4218, 4218, 4218, 7, 8], dtype=torch.long)
    payload = Payload(
        codes=Codes(audio=ids),
        meta=MiniCPMOMeta(
            request_id="r_x", chunk_seq=4, cache_epoch=1, last_chunk=False, duplex_epoch=2
        ),
        request_id="r_x",
    )
    encoded, decoded = _round_trip(payload)
    assert encoded.record_type == "codec_chunk"  # type: ignore[attr-defined]
    chunk = wire.decode(encoded.value)  # type: ignore[attr-defined]
    assert isinstance(chunk, CodecChunk) and chunk.codes == tuple(ids.tolist())
    assert (chunk.cache_epoch, chunk.chunk_seq, chunk.duplex_epoch) == (1, 4, 2)
    expected = {
        "codes": {"audio": ids},
        "meta": {
            "request_id": "r_x",
            "chunk_seq": 4,
            "cache_epoch": 1,
            "last_chunk": False,
            "duplex_epoch": 2,
        },
        "request_id": "r_x",
    }
    assert payload_equal(decoded.payload, expected)  # type: ignore[attr-defined]
    assert _keys(decoded.payload) == _msgspec_keys(payload)  # type: ignore[attr-defined]


def test_on_the_codec_edge_a_window_whose_metadata_was_lost_is_still_a_codec_chunk() -> None:
    stripped = Payload(codes=Codes(audio=torch.tensor([1, 2, 3])), request_id="r_x")
    assert _encode(stripped).record_type == "payload_envelope"  # type: ignore[attr-defined]
    encoded = _encode(stripped, codec_edge=True)
    chunk = wire.decode(encoded.value)  # type: ignore[attr-defined]
    # the defaults the upstream Code2Wav substitutes for missing producer fields
    assert chunk == CodecChunk("r_x", (1, 2, 3), produced_at_ms=5)
    assert _encode(minicpmo_payload(CHUNK), codec_edge=False).record_type == "payload_envelope"  # type: ignore[attr-defined]


def test_on_the_codec_edge_a_payload_without_codes_is_a_finish_control_event() -> None:
    end = Payload(meta=Meta(finished=torch.tensor(True), is_segment_finished=torch.tensor(False)))
    boundary = Payload(meta=Meta(is_segment_finished=torch.tensor(True)), request_id="r_x")
    for payload, reason, terminal in (
        (end, "vllm-omni end marker", True),
        (boundary, "vllm-omni control-only boundary", False),
    ):
        encoded = _encode(payload, codec_edge=True)
        assert encoded.record_type == "control_event"  # type: ignore[attr-defined]
        event = wire.decode(encoded.value)  # type: ignore[attr-defined]
        assert event == ControlEvent("r_x", ControlKind.FINISH, reason, 5)
        decoded = decode_payload(encoded.value, encoded.headers)  # type: ignore[attr-defined]
        assert decoded is not None and decoded.terminal is terminal
        assert _keys(decoded.payload) == _msgspec_keys(payload)
    assert _encode(end).record_type == "payload_envelope"  # type: ignore[attr-defined]
