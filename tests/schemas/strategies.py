"""Hypothesis strategies for every wire record type, shared by every test that draws records.

A record's fields are drawn by their type in its latest shipped schema (schemas/avro): `int`
and `long` over their whole range, strings, bytes, booleans, lists of ids, enums, and `null`
for the nullable ones. The module-level strategies are those (the tests of schemas/); a test of
the fold or the pipeline draws from narrower `Draws` (small values collide, so the state machine
is exercised).

(Imported as `tests.schemas.strategies`: pytest puts the repository root on sys.path, see
`pythonpath` in pyproject.toml.)
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, TypeVar

from hypothesis import strategies as st

from codeclog.schemas import catalog
from codeclog.schemas.records import (
    AudioChunk,
    CodecChunk,
    ControlEvent,
    DeadLetter,
    StreamCheckpoint,
)

R = TypeVar("R")
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=24)  # hypothesis text never holds lone surrogates: always UTF-8-able
BLOB = st.binary(max_size=64)
CODES = st.lists(INT32, max_size=40).map(tuple)
INT_LISTS = st.lists(INT32, max_size=8).map(tuple)


@dataclasses.dataclass(frozen=True)
class Draws:
    """What the fields of a record are drawn from, by schema type (request ids and codec ids by
    name)."""

    int32: st.SearchStrategy[int] = INT32
    int64: st.SearchStrategy[int] = INT64
    text: st.SearchStrategy[str] = TEXT
    blob: st.SearchStrategy[bytes] = BLOB
    request_ids: st.SearchStrategy[str] = TEXT
    codes: st.SearchStrategy[tuple[int, ...]] = CODES
    int_lists: st.SearchStrategy[tuple[int, ...]] = INT_LISTS


def records_of(record_type: type[R], d: Draws) -> st.SearchStrategy[R]:
    """`record_type` with every field of its latest schema drawn from `d`."""
    schema = json.loads(catalog.registry().latest_by_type[record_type].text)
    hints = typing.get_type_hints(record_type)
    fields = {
        f["name"]: _drawn(f["name"], f["type"], hints[f["name"]], d) for f in schema["fields"]
    }
    return st.builds(record_type, **fields)


def _drawn(name: str, avro_type: Any, python_type: Any, d: Draws) -> st.SearchStrategy[Any]:
    if isinstance(avro_type, list):  # ["null", T]
        return st.none() | _drawn(name, avro_type[1], python_type, d)
    if name == "request_id":
        return d.request_ids
    if name == "codes":
        return d.codes
    if isinstance(avro_type, dict):  # an array of ids, or an enum
        return d.int_lists if avro_type["type"] == "array" else st.sampled_from(python_type)
    primitive = {"int": d.int32, "long": d.int64, "string": d.text, "bytes": d.blob}
    return primitive.get(avro_type, st.booleans())


FULL_RANGE = Draws()
codec_chunks = records_of(CodecChunk, FULL_RANGE)
control_events = records_of(ControlEvent, FULL_RANGE)
audio_chunks = records_of(AudioChunk, FULL_RANGE)
dead_letters = records_of(DeadLetter, FULL_RANGE)
stream_checkpoints = records_of(StreamCheckpoint, FULL_RANGE)
records = st.one_of(codec_chunks, control_events, audio_chunks, dead_letters, stream_checkpoints)
