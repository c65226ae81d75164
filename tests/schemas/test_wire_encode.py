"""`encode` refuses what the schema cannot carry, with one typed error."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from fastavro.validation import validate
from hypothesis import given
from hypothesis import strategies as st

from codeclog.errors import CodeclogError
from codeclog.schemas import catalog, wire
from codeclog.schemas.records import AudioChunk, CodecChunk, ControlEvent, ControlKind, DeadLetter

CHUNK = CodecChunk("r", (1, 2, 3, 4))
AUDIO = AudioChunk("r", 0, (0,), 0, 0, 24000, b"", "", False)
LETTER = DeadLetter("malformed", "codec.chunks", 0, 0, b"")


def _bad(record: Any, **changes: Any) -> Any:
    # Records are frozen and typed; a buggy caller can still build one with wrong values.
    return dataclasses.replace(record, **changes)


INVALID: dict[str, tuple[Any, str]] = {
    "code_above_int32": (_bad(CHUNK, codes=(1, 2**31)), "CodecChunk.codes"),
    "code_below_int32": (_bad(CHUNK, codes=(-(2**31) - 1,)), "CodecChunk.codes"),
    "chunk_seq_above_int32": (_bad(CHUNK, chunk_seq=2**31), "CodecChunk.chunk_seq"),
    "nullable_int_above_int32": (_bad(CHUNK, ref_audio_sr=2**32), "CodecChunk.ref_audio_sr"),
    "long_above_int64": (_bad(CHUNK, duplex_epoch=2**63), "CodecChunk.duplex_epoch"),
    "bool_as_int": (_bad(CHUNK, cache_epoch=True), "CodecChunk.cache_epoch"),
    "float_code": (_bad(CHUNK, codes=(1.5,)), "CodecChunk.codes"),
    "missing_request_id_object": (_bad(CHUNK, request_id=None), "CodecChunk.request_id"),
    "text_as_bytes": (_bad(CHUNK, llm_output_text_utf8="hi"), "llm_output_text_utf8"),
    "unencodable_text": (_bad(CHUNK, producer_id="\ud800"), "surrogate"),
    "kind_not_an_enum_value": (_bad(ControlEvent("r", ControlKind.ABORT), kind="pause"), "kind"),
    "negative_offset_above_int64": (_bad(LETTER, source_offset=-(2**63) - 1), "source_offset"),
    "pcm_none": (_bad(AUDIO, pcm_s16le=None), "AudioChunk.pcm_s16le"),
}


@pytest.mark.parametrize("case", INVALID, ids=INVALID.keys())
def test_invalid_record_raises_encode_error_naming_the_field(case: str) -> None:
    record, names = INVALID[case]
    with pytest.raises(wire.EncodeError) as caught:
        wire.encode(record)
    assert names in str(caught.value)
    assert isinstance(caught.value, CodeclogError)
    assert caught.value.record_type == type(record).__name__


def test_extremes_of_each_integer_type_encode() -> None:
    """Control for the table: the bounds themselves are valid."""
    edge = _bad(CHUNK, codes=(-(2**31), 2**31 - 1), duplex_epoch=-(2**63), duplex_turn_id=2**63 - 1)
    assert wire.decode(wire.encode(edge)) == edge


def test_non_record_raises_encode_error() -> None:
    with pytest.raises(wire.EncodeError, match="not a codeclog record type"):
        wire.encode({"request_id": "r"})  # type: ignore[arg-type]


ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.lists(st.integers(), max_size=4),
    st.lists(st.integers(), max_size=4).map(tuple),
    st.sampled_from(["abort", "finish", "pause"]),
)


@given(st.sampled_from(sorted(catalog.RECORD_TYPES)), st.data())
def test_exact_checks_never_vouch_for_what_fastavro_refuses(name: str, data: st.DataObject) -> None:
    """encode skips fastavro's validator when the exact checks pass: they must be sound."""
    version = catalog.registry().latest[name]
    field, check = data.draw(st.sampled_from(version.value_checks))
    value = data.draw(ANY_VALUE)
    if check(value):
        datum = {field: value}
        field_schema = next(f for f in version.parsed["fields"] if f["name"] == field)
        schema = {"type": "record", "name": "One", "fields": [field_schema]}
        assert validate(datum, schema, raise_errors=False), (field, value)


def test_numpy_integers_encode_through_the_validator() -> None:
    codes = tuple(np.arange(4, dtype=np.int64))
    decoded = wire.decode(wire.encode(_bad(CHUNK, codes=codes, chunk_seq=np.int32(3))))
    assert isinstance(decoded, CodecChunk)
    assert decoded.codes == (0, 1, 2, 3) and decoded.chunk_seq == 3
