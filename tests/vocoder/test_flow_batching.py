"""Batching never changes a request's bytes: batch == solo exactly, isolation, re-chunking."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

import torch

from codeclog.vocoder.flow import (
    FlowConfig,
    FlowInputError,
    FlowRejectReason,
    FlowState,
    Token2WavFlow,
    canonical_windows,
)
from codeclog.vocoder.flow.parallel import RowThreads
from codeclog.vocoder.flow.stable import (
    CPU_GEMM_TILE,
    StableConv1d,
    stable_linear,
    stable_matmul,
    tiled_gemms,
)
from tests.vocoder.flow_helpers import PROMPT_TOKENS, prompt, random_ids

pytestmark = pytest.mark.vocoder


@pytest.fixture(autouse=True)
def batch_invariant() -> Iterator[None]:
    """As a batch-invariant engine decodes (Code2WavEngine.scope): GEMMs over fixed row tiles.
    Without it a row's last bits may depend on the row count on some CPUs (an emulated Intel
    AVX2 CPU: vocoder/flow/stable.py), and no test may assert what depends on the CPU."""
    with tiled_gemms():
        yield


def stream(seed: int, length: int) -> list[int]:
    ids: list[int] = random_ids(seed, length).tolist()
    return ids


def solo_run(flow: Token2WavFlow, state: FlowState, ids: Sequence[int]) -> list[bytes]:
    """Mel bytes per canonical window of a stream decoded alone, then the final state's."""
    out = []
    for window, last in canonical_windows(ids):
        mel, [state] = flow.decode_chunk_batch([state], torch.tensor([window]), last)
        out.append(mel.numpy().tobytes())
    return [*out, state.to_bytes()]


@pytest.fixture(scope="module")
def voices(flow: Token2WavFlow) -> list[FlowState]:
    return [prompt(flow, seed) for seed in range(5)]


# (case id, number of requests, window ids, last_chunk)
BATCH_CASES = [
    ("pair-canonical", 2, 28, False),
    ("five-canonical", 5, 28, False),
    ("three-short-unit", 3, 8, False),
    ("four-minimum", 4, 4, False),
    ("five-final", 5, 17, True),
    ("two-final-one-id", 2, 1, True),
]


@pytest.mark.parametrize(
    ("count", "width", "last"),
    [(n, w, last) for _, n, w, last in BATCH_CASES],
    ids=[c for c, *_ in BATCH_CASES],
)
def test_batch_equals_solo_exactly(
    flow: Token2WavFlow, voices: list[FlowState], count: int, width: int, last: bool
) -> None:
    # Advance every voice by one window first so the caches are not the setup caches.
    warm_ids = torch.tensor([stream(50 + i, 28) for i in range(count)])
    _, states = flow.decode_chunk_batch(voices[:count], warm_ids, False)
    tokens = torch.tensor([stream(100 + i, width) for i in range(count)])
    mel, batched = flow.decode_chunk_batch(states, tokens, last)
    for row in range(count):
        solo_mel, [solo] = flow.decode_chunk_batch([states[row]], tokens[row : row + 1], last)
        assert torch.equal(mel[row : row + 1], solo_mel), f"row {row} mel differs"
        assert batched[row].to_bytes() == solo.to_bytes(), f"row {row} state differs"


def test_batch_position_and_mates_do_not_matter(
    flow: Token2WavFlow, voices: list[FlowState]
) -> None:
    tokens = torch.tensor([stream(200 + i, 28) for i in range(5)])
    reference, _ = flow.decode_chunk_batch(voices, tokens, False)
    for order in ([4, 3, 2, 1, 0], [2, 0], [1, 4, 3], [3]):
        mel, _ = flow.decode_chunk_batch([voices[i] for i in order], tokens[order], False)
        for slot, row in enumerate(order):
            assert torch.equal(mel[slot], reference[row]), (order, row)


def test_request_isolation_under_every_interleaving(
    flow: Token2WavFlow, voices: list[FlowState]
) -> None:
    ids = {"a": stream(1, 2 * 25 + 3 + 4), "b": stream(2, 2 * 25 + 3 + 9)}
    windows = {key: canonical_windows(value) for key, value in ids.items()}
    expected = {key: solo_run(flow, voices[i], ids[key]) for i, key in enumerate(("a", "b"))}
    steps = ["a"] * len(windows["a"]) + ["b"] * len(windows["b"])
    for schedule in sorted(set(itertools.permutations(steps))):
        states = {"a": voices[0], "b": voices[1]}
        got: dict[str, list[bytes]] = {"a": [], "b": []}
        for key in schedule:
            window, last = windows[key][len(got[key])]
            mel, [states[key]] = flow.decode_chunk_batch(
                [states[key]], torch.tensor([window]), last
            )
            got[key].append(mel.numpy().tobytes())
        for key, state in states.items():
            got[key].append(state.to_bytes())
        assert got == expected, schedule


def decode_grouped(
    flow: Token2WavFlow, states: list[FlowState], rows: list[list[int]], last: bool
) -> tuple[list[torch.Tensor], list[FlowState], int]:
    """What an engine does: one batch per shape signature. Returns per-row mel, new states and
    the size of the target's (row 0's) batch."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for index, state in enumerate(states):
        groups.setdefault(state.shape_signature(), []).append(index)
    mels: list[torch.Tensor] = [torch.empty(0)] * len(states)
    new = list(states)
    target_batch = 0
    for members in groups.values():
        mel, out = flow.decode_chunk_batch(
            [states[i] for i in members], torch.tensor([rows[i] for i in members]), last
        )
        for slot, index in enumerate(members):
            mels[index], new[index] = mel[slot], out[slot]
        target_batch = len(members) if 0 in members else target_batch
    return mels, new, target_batch


def test_rechunked_stream_is_identical_whatever_the_batching(
    flow: Token2WavFlow, voices: list[FlowState]
) -> None:
    """Canonical 25 + 3 windows of one stream give the same mel alone, or batched with mates
    at any phase of their own streams (the schedule, not the batching, fixes the audio)."""
    target = stream(7, 4 * 25 + 3 + 11)
    expected = solo_run(flow, voices[0], target)
    for mates in (1, 3):
        for skew in (0, 1, 2):
            states = [voices[0]] + [voices[1 + m] for m in range(mates)]
            for m in range(mates):  # put each mate `skew + m` windows ahead of the target
                for _ in range(skew + m):
                    _, [states[1 + m]] = flow.decode_chunk_batch(
                        [states[1 + m]], torch.tensor([stream(300 + m, 28)]), False
                    )
            got, batch_sizes = [], []
            for window, last in canonical_windows(target):
                rows = [list(window)] + [stream(400 + m, len(window)) for m in range(mates)]
                mels, states, size = decode_grouped(flow, states, rows, last)
                got.append(mels[0][None].numpy().tobytes())
                batch_sizes.append(size)
            got.append(states[0].to_bytes())  # chunks_done too: each row keeps its own count
            assert got == expected, (mates, skew)
            # once every cache is trimmed to prompt + 100 frames, all requests share one batch
            assert batch_sizes[-1] == mates + 1, (mates, skew, batch_sizes)


@pytest.mark.parametrize("parts", [2, 3])
def test_estimator_rows_in_parts_equal_one_call(
    flow: Token2WavFlow, voices: list[FlowState], parts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The solver may estimate its rows in parts on other threads (vocoder.flow.parallel): every
    row's mel and caches are the bytes of the one call (forced here: the tiny model's rows are
    below the size that makes a split worth it)."""
    monkeypatch.setattr("codeclog.vocoder.flow.cfm.MIN_ROW_MACS", 0)
    calls: list[int] = []

    def in_scope(task: Callable[[], object]) -> object:
        with tiled_gemms(), torch.inference_mode():
            return task()

    def run(tasks: Sequence[Callable[[], object]]) -> list[object]:
        calls.append(len(tasks))
        with ThreadPoolExecutor(len(tasks)) as pool:
            return list(pool.map(in_scope, tasks))

    states = voices[:2]
    tokens = torch.tensor([stream(40 + i, 28) for i in range(2)])
    mel, whole = flow.decode_chunk_batch(states, tokens, False)
    split_mel, split = flow.decode_chunk_batch(states, tokens, False, RowThreads(run, parts))
    assert calls == [min(parts, 4)] * flow.config.n_timesteps  # 2 requests: 4 estimator rows
    assert torch.equal(mel, split_mel)
    assert [s.to_bytes() for s in whole] == [s.to_bytes() for s in split]


def test_unequal_signatures_are_refused(flow: Token2WavFlow, voices: list[FlowState]) -> None:
    _, [ahead] = flow.decode_chunk_batch([voices[1]], torch.tensor([stream(1, 28)]), False)
    with pytest.raises(FlowInputError) as caught:
        flow.decode_chunk_batch([voices[0], ahead], torch.tensor([stream(1, 28)] * 2), False)
    assert caught.value.reason is FlowRejectReason.STATE_SIGNATURE_MISMATCH
    shorter = prompt(flow, seed=9, tokens=PROMPT_TOKENS - 1)
    with pytest.raises(FlowInputError):
        flow.decode_chunk_batch([voices[0], shorter], torch.tensor([stream(1, 28)] * 2), False)


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(min_value=2, max_value=6),
    rows=st.integers(min_value=1, max_value=40),
    width=st.sampled_from([32, 80, 96, 192, 256, 320]),
)
def test_stable_linear_batch_rows_equal_solo(batch: int, rows: int, width: int) -> None:
    """Property behind batch == solo: a request's rows get the bytes they get alone."""
    g = torch.Generator().manual_seed(batch * 1000 + rows * 131 + width)
    weight, bias = torch.randn(48, width, generator=g), torch.randn(48, generator=g)
    x = torch.randn(batch, rows, width, generator=g)
    together = stable_linear(x, weight, bias)
    for index in range(batch):
        assert torch.equal(
            together[index : index + 1], stable_linear(x[index : index + 1], weight, bias)
        )
    assert torch.allclose(together, torch.nn.functional.linear(x, weight, bias), atol=1e-4)


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(min_value=2, max_value=6),
    queries=st.integers(min_value=1, max_value=50),
    keys=st.integers(min_value=1, max_value=160),
)
def test_stable_matmul_batch_rows_equal_solo(batch: int, queries: int, keys: int) -> None:
    """Attention's batched matmuls: one call over every request's heads gives each request the
    bytes of its own call (the shapes of a tiny-model attention: 2 heads of 16)."""
    g = torch.Generator().manual_seed(batch * 10_000 + queries * 200 + keys)
    q = torch.randn(batch, 2, queries, 16, generator=g)
    k = torch.randn(batch, 2, keys, 16, generator=g)
    scores = stable_matmul(q, k.transpose(-2, -1))
    values = stable_matmul(scores, k)
    for index in range(batch):
        row = slice(index, index + 1)
        assert torch.equal(scores[row], stable_matmul(q[row], k[row].transpose(-2, -1)))
        assert torch.equal(values[row], stable_matmul(scores[row], k[row]))


def test_tiled_gemms_give_every_gemm_one_tile_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside tiled_gemms every GEMM matrix is a tile of CPU_GEMM_TILE rows, whatever the batch
    and the row count (one batched call over the tiles: no CPU kernel can see the batch);
    outside it one GEMM covers the batch (a GPU engine)."""
    matrices: list[tuple[int, ...]] = []
    linear, bmm, baddbmm = torch.nn.functional.linear, torch.bmm, torch.baddbmm

    def one(x: torch.Tensor, *args: object) -> torch.Tensor:
        matrices.append(tuple(x.shape))
        return linear(x, *args)  # type: ignore[arg-type]

    def batched(x: torch.Tensor, *args: object) -> torch.Tensor:
        matrices.extend([tuple(x.shape[1:])] * x.shape[0])
        return bmm(x, *args)  # type: ignore[arg-type]

    def batched_add(bias: torch.Tensor, x: torch.Tensor, *args: object) -> torch.Tensor:
        matrices.extend([tuple(x.shape[1:])] * x.shape[0])
        return baddbmm(bias, x, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.nn.functional, "linear", one)
    monkeypatch.setattr(torch, "bmm", batched)
    monkeypatch.setattr(torch, "baddbmm", batched_add)
    weight, bias = torch.randn(8, 32), torch.randn(8)
    tile = (CPU_GEMM_TILE, 32)
    stable_linear(torch.randn(3, 20, 32), weight, None)  # 60 rows
    assert matrices == [tile] * -(-60 // CPU_GEMM_TILE)
    matrices.clear()
    with tiled_gemms():  # re-entrant
        pass
    stable_linear(torch.randn(1, 1, 32), weight, bias)  # one row: one padded tile
    assert matrices == [tile]  # still inside the fixture's scope
    matrices.clear()
    stable_linear(torch.randn(16, 2 * CPU_GEMM_TILE + 1, 32), weight, bias)
    assert matrices == [tile] * (32 + 1)
    matrices.clear()
    with monkeypatch.context() as inner:
        inner.setattr("codeclog.vocoder.flow.stable._local.tiled", False)
        stable_linear(torch.randn(3, 20, 32), weight, None)
        stable_linear(torch.randn(1, 3, 32), weight, None)  # few rows: padded to 16
    assert matrices == [(60, 32), (16, 32)]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(min_value=1, max_value=3 * CPU_GEMM_TILE),
    mates_before=st.integers(min_value=0, max_value=4 * CPU_GEMM_TILE),
    mates_after=st.integers(min_value=0, max_value=2 * CPU_GEMM_TILE),
    shape=st.sampled_from([(32, 32), (32, 64), (96, 32), (320, 512), (512, 512), (512, 2048)]),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_tiled_linear_row_bytes_never_depend_on_mates_or_position(
    rows: int, mates_before: int, mates_after: int, shape: tuple[int, int], seed: int
) -> None:
    """The tile property itself: a block of rows gets the bytes it gets alone wherever it lands
    among any number of other rows (any tile, any position in a tile), at the tiny and the
    published sizes' projection shapes (K, N)."""
    width, out = shape
    g = torch.Generator().manual_seed(seed)
    weight, bias = torch.randn(out, width, generator=g), torch.randn(out, generator=g)
    mine = torch.randn(rows, width, generator=g)
    before = torch.randn(mates_before, width, generator=g)
    after = torch.randn(mates_after, width, generator=g) * 3.0
    together = stable_linear(torch.cat([before, mine, after]), weight, bias)
    alone = stable_linear(mine, weight, bias)
    assert torch.equal(together[mates_before : mates_before + rows], alone)


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(min_value=2, max_value=6), frames=st.integers(min_value=3, max_value=40))
def test_stable_conv_batch_rows_equal_solo(batch: int, frames: int) -> None:
    conv = StableConv1d(16, 24, 3).to_empty(device="cpu")
    assert conv.bias is not None
    g = torch.Generator().manual_seed(batch * 100 + frames)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=g))
        conv.bias.copy_(torch.randn(conv.bias.shape, generator=g))
        x = torch.randn(batch, 16, frames, generator=g)
        together = conv(x)
        reference = torch.nn.functional.conv1d(x, conv.weight, conv.bias)
        for row in range(batch):
            assert torch.equal(together[row : row + 1], conv(x[row : row + 1]))
    assert torch.allclose(together, reference, atol=1e-4)  # it is still the same convolution


@pytest.mark.slow
def test_full_size_batch_equals_solo_exactly() -> None:
    """The published sizes take other GEMM shapes than tiny: check them too (2 Euler steps)."""
    flow = Token2WavFlow(dataclasses.replace(FlowConfig.full(), n_timesteps=2))
    states = [prompt(flow, seed, tokens=4) for seed in range(3)]
    for width, last in ((28, False), (2, True)):
        tokens = torch.tensor([stream(500 + i + width, width) for i in range(3)])
        mel, batched = flow.decode_chunk_batch(states, tokens, last)
        for row in range(3):
            solo_mel, [solo] = flow.decode_chunk_batch([states[row]], tokens[row : row + 1], last)
            assert torch.equal(mel[row : row + 1], solo_mel), (width, row)
            assert batched[row].to_bytes() == solo.to_bytes(), (width, row)
        states = batched


@settings(max_examples=12, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=16), min_size=1, max_size=3),
    mate_seeds=st.lists(st.integers(min_value=0, max_value=10**6), min_size=15, max_size=15),
    final=st.booleans(),
)
def test_a_streams_bytes_are_the_same_at_every_batch_size_with_any_mates(
    flow: Token2WavFlow,
    voices: list[FlowState],
    sizes: list[int],
    mate_seeds: list[int],
    final: bool,
) -> None:
    """Property over random batch compositions: stream 0's window, decoded in batches of 1 to 16
    streams with random mates (voices, ids) at a random slot, gives the bytes of its solo decode
    (mel and new state)."""
    width = 17 if final else 28
    target = stream(77, width)
    alone_mel, [alone] = flow.decode_chunk_batch([voices[0]], torch.tensor([target]), final)
    for size in sizes:
        seeds = mate_seeds[: size - 1]
        slot = seeds[0] % size if seeds else 0
        mates = [(voices[seed % len(voices)], stream(seed, width)) for seed in seeds]
        rows = [*mates[:slot], (voices[0], target), *mates[slot:]]
        mel, states = flow.decode_chunk_batch(
            [state for state, _ in rows], torch.tensor([ids for _, ids in rows]), final
        )
        assert torch.equal(mel[slot : slot + 1], alone_mel), (size, slot)
        assert states[slot].to_bytes() == alone.to_bytes(), (size, slot)
