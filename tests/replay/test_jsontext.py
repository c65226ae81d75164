"""replay.jsontext writes exactly what json.dumps(sort_keys=True, indent=1, ensure_ascii=False)
writes, for any JSON-like value, and defers to it for anything else."""

from __future__ import annotations

import enum
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.replay.jsontext import dumps_sorted_indent1

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=40,
)


def reference(value: Any) -> str:
    return json.dumps(value, sort_keys=True, indent=1, ensure_ascii=False)


@settings(max_examples=400, deadline=None)
@given(VALUES)
def test_the_same_text_as_json_dumps(value: Any) -> None:
    assert dumps_sorted_indent1(value) == reference(value)


class Colour(enum.IntEnum):
    RED = 1


class Name(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {1: "int key", 2: [3]},
        {"a": Colour.RED},
        {"name": Name("x"), "b": [Name("y")]},
        {"nested": {None: 1}, "z": 2.5},
        [{"k": float("nan")}, {"k": -float("inf")}, {'é\n"': "\u2028"}],
    ],
)
def test_unusual_values_are_written_by_json_itself(value: Any) -> None:
    assert dumps_sorted_indent1(value) == reference(value)


def test_what_json_refuses_is_refused_the_same_way() -> None:
    for value in ({"a": {1, 2}}, {"a": 1, 2: "b"}, [object()]):
        with pytest.raises(TypeError):
            reference(value)
        with pytest.raises(TypeError):
            dumps_sorted_indent1(value)
