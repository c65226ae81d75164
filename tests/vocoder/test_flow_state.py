"""FlowState: exact serialisation, resume after restore, determinism across processes."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

import torch

from codeclog.vocoder.flow import (
    FlowState,
    FlowStateError,
    Token2WavFlow,
    canonical_windows,
)
from tests.processes import run_in_tree
from tests.vocoder.flow_helpers import prompt, random_ids

pytestmark = pytest.mark.vocoder


def windows(seed: int) -> list[tuple[tuple[int, ...], bool]]:
    return canonical_windows(random_ids(seed, 5 * 25 + 3 + 6).tolist())


def run(
    flow: Token2WavFlow, state: FlowState, plan: list[tuple[tuple[int, ...], bool]]
) -> tuple[list[bytes], FlowState]:
    out = []
    for window, last in plan:
        mel, [state] = flow.decode_chunk_batch([state], torch.tensor([window]), last)
        out.append(mel.numpy().tobytes())
    return out, state


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_serialise_after_chunk_k_restore_and_continue_gives_the_same_bytes(
    flow: Token2WavFlow, k: int
) -> None:
    plan = windows(seed=k)
    straight, end = run(flow, prompt(flow, seed=2), plan)
    head, middle = run(flow, prompt(flow, seed=2), plan[:k])
    restored = FlowState.from_bytes(middle.to_bytes())
    assert restored.to_bytes() == middle.to_bytes()
    tail, resumed_end = run(flow, restored, plan[k:])
    assert head + tail == straight
    assert resumed_end.to_bytes() == end.to_bytes()


def test_round_trip_keeps_every_field(flow: Token2WavFlow) -> None:
    _, state = run(flow, prompt(flow, seed=3), windows(seed=3)[:2])
    back = FlowState.from_bytes(state.to_bytes())
    for name in ("conformer_cnn_cache", "conformer_att_cache", "estimator_cnn_cache"):
        assert torch.equal(getattr(back, name), getattr(state, name))
    assert torch.equal(back.estimator_att_cache, state.estimator_att_cache)
    assert torch.equal(back.spk, state.spk)
    assert (back.prompt_frames, back.chunks_done, back.finished) == (24, 2, False)
    assert back.shape_signature() == state.shape_signature()
    assert back.nbytes == state.nbytes


def make_state(
    tensors: list[torch.Tensor], prompt_frames: int, chunks_done: int, finished: bool = False
) -> FlowState:
    return FlowState(
        conformer_cnn_cache=tensors[0],
        conformer_att_cache=tensors[1],
        estimator_cnn_cache=tensors[2],
        estimator_att_cache=tensors[3],
        spk=tensors[4],
        prompt_frames=prompt_frames,
        chunks_done=chunks_done,
        finished=finished,
    )


tensor_strategy = st.builds(
    lambda shape, dtype, seed: (
        (torch.randn(shape, generator=torch.Generator().manual_seed(seed))).mul(1e3).to(dtype)
    ),
    st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=3),
    st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]),
    st.integers(min_value=0, max_value=2**16),
)


@settings(max_examples=60, deadline=None)
@given(
    tensors=st.lists(tensor_strategy, min_size=5, max_size=5),
    ints=st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)),
    finished=st.booleans(),
)
def test_bytes_round_trip_is_exact_for_any_tensors(
    tensors: list[torch.Tensor], ints: tuple[int, int], finished: bool
) -> None:
    state = make_state(tensors, prompt_frames=ints[0], chunks_done=ints[1], finished=finished)
    data = state.to_bytes()
    back = FlowState.from_bytes(data)
    assert back.to_bytes() == data
    names = ("conformer_cnn_cache", "conformer_att_cache", "estimator_cnn_cache")
    for name, original in zip((*names, "estimator_att_cache", "spk"), tensors, strict=True):
        value = getattr(back, name)
        assert value.dtype == original.dtype and value.shape == original.shape
        raw = value.reshape(-1).view(torch.uint8)  # bit equality, NaN payloads and -0.0 included
        assert raw.equal(original.contiguous().reshape(-1).view(torch.uint8))


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(min_value=0, max_value=10_000))
def test_truncated_bytes_are_refused(cut: int) -> None:
    state = make_state([torch.ones(3, 4)] * 5, prompt_frames=2, chunks_done=0)
    data = state.to_bytes()
    with pytest.raises(FlowStateError):
        FlowState.from_bytes(data[: cut % len(data)])


# (case id, byte edit)
CORRUPTIONS = [
    ("bad-magic", lambda b: b"X" + b[1:]),
    ("future-version", lambda b: b[:8] + (99).to_bytes(2, "little") + b[10:]),
    ("garbage-header", lambda b: b[:14] + b"\xff" * 20 + b[34:]),
    ("extra-payload", lambda b: b + b"\x00"),
]


@pytest.mark.parametrize("edit", [e for _, e in CORRUPTIONS], ids=[c for c, _ in CORRUPTIONS])
def test_corrupt_bytes_are_refused(edit: object) -> None:
    state = make_state([torch.ones(3, 4)] * 5, prompt_frames=2, chunks_done=0)
    with pytest.raises(FlowStateError):
        FlowState.from_bytes(edit(state.to_bytes()))  # type: ignore[operator]


CHILD = r"""
import hashlib, json, sys, dataclasses
import torch
torch.manual_seed(int(sys.argv[1]))  # a different global RNG state in every child
torch.set_num_threads(1)
from codeclog.vocoder.flow import FlowConfig, FlowState, Token2WavFlow, canonical_windows
flow = Token2WavFlow(dataclasses.replace(FlowConfig.tiny(), n_timesteps=4))
g = torch.Generator().manual_seed(2)
state = flow.prepare_prompt(torch.randint(0, 6561, (12,), generator=g),
                            torch.randn(24, 80, generator=g), torch.randn(192, generator=g))
ids = torch.randint(0, 6561, (5 * 25 + 3 + 6,), generator=torch.Generator().manual_seed(0))
plan = canonical_windows(ids.tolist())
start = 0
if sys.argv[2] != "-":  # resume from a state another process saved after window 2
    state, start = FlowState.from_bytes(open(sys.argv[2], "rb").read()), 2
digests = []
for index, (window, last) in enumerate(plan):
    if index < start:
        continue
    mel, [state] = flow.decode_chunk_batch([state], torch.tensor([window]), last)
    digests.append(hashlib.sha256(mel.numpy().tobytes()).hexdigest())
    if index == 1 and len(sys.argv) > 3:
        open(sys.argv[3], "wb").write(state.to_bytes())
print(json.dumps({"mel": digests, "state": hashlib.sha256(state.to_bytes()).hexdigest()}))
"""


def child(*args: str) -> dict[str, object]:
    done = run_in_tree([sys.executable, "-c", CHILD, *args], timeout_s=240, OMP_NUM_THREADS="1")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(result, dict)
    return result


@pytest.mark.slow
@pytest.mark.long  # 20 s of CI; test_engine_processes runs two seeds in two processes, and the
# SIGKILL tests restore states in fresh processes and verify the bytes
def test_two_processes_with_different_global_seeds_give_identical_bytes(tmp_path: Path) -> None:
    saved = tmp_path / "after_window_2.state"
    first = child("1", "-", str(saved))
    second = child("987654", "-")
    assert first == second
    resumed = child("5", str(saved))  # restore in a fresh process and continue
    assert isinstance(first["mel"], list)
    assert resumed["mel"] == first["mel"][2:]
    assert resumed["state"] == first["state"]
    assert hashlib.sha256(saved.read_bytes()).hexdigest() != first["state"]
