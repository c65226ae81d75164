"""A stream state's size bound (what the memory budget charges) and the tensor codec."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.vocoder.engine import Code2WavEngine
from codeclog.vocoder.flow import canonical_windows
from codeclog.vocoder.tensor_codec import (
    TensorCodecError,
    tensor_bytes,
    tensor_from_bytes,
    tensor_spec,
)

pytestmark = pytest.mark.vocoder


def test_peak_state_bytes_is_the_largest_state_a_stream_holds() -> None:
    engine = Code2WavEngine.from_spec("tiny")
    rng = random.Random(7)
    state = engine.setup()
    sizes = [state.nbytes]
    for ids, final in canonical_windows([rng.randrange(6561) for _ in range(200)]):
        [(_, state)] = engine.decode_batch([(state, ids, final)])
        if not final:
            sizes.append(state.nbytes)
    assert max(sizes) == engine.peak_state_bytes()
    assert sizes[-1] == max(sizes)  # reached and kept: the caches are trimmed back to it


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=3),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.int64]),
)
def test_the_codec_round_trips_every_shape_including_empty(
    shape: list[int], dtype: torch.dtype
) -> None:
    tensor = torch.arange(int(torch.tensor(shape).prod()) if shape else 1).reshape(shape).to(dtype)
    blob = tensor_bytes(tensor)
    back = tensor_from_bytes(blob, tensor_spec(tensor, len(blob)))
    assert back.dtype == dtype and back.shape == tensor.shape and torch.equal(back, tensor)


def test_an_empty_strided_view_encodes_to_nothing() -> None:
    view = torch.zeros(80, 0).expand(80, 0)
    assert tensor_bytes(view) == b""


def test_the_codec_refuses_blobs_its_spec_does_not_describe() -> None:
    tensor = torch.ones(3)
    blob = tensor_bytes(tensor)
    with pytest.raises(TensorCodecError, match="truncated"):
        tensor_from_bytes(blob[:-1], tensor_spec(tensor, len(blob)))
    with pytest.raises(TensorCodecError, match="dtype"):
        tensor_from_bytes(blob, {**tensor_spec(tensor, len(blob)), "dtype": "nope"})
    with pytest.raises(TensorCodecError, match="shape"):
        tensor_from_bytes(blob, {**tensor_spec(tensor, len(blob)), "shape": [5]})
