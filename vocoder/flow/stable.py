"""Batch-invariant building blocks: a request's numbers never depend on its batch mates
(docs/vocoder.md, "Batch versus solo")."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from codeclog.vocoder.kernels import portable_active
from codeclog.vocoder.shared import thread_setting

MIN_GEMM_ROWS = 16  # comfortably above the measured small-M threshold (12)
# Rows per GEMM tile inside tiled_gemms (BENCHMARKS.md, "Issue 61"). Part of the native CPU
# determinism domain (`:m52`, vocoder/domain.py): another tile size gives other bytes.
CPU_GEMM_TILE = 52  # measured on 2 CPU cores, tiny and published sizes, b = 1..16
CUDA_GEMM_TILE = 128  # a batch-invariant CUDA engine's (opt-in); not yet measured on a GPU

# Every weight is allocated on the meta device (no memory, no initialisation, no RNG) and then
# materialised and initialised once, from a seeded generator, by Token2WavFlow.
META = torch.device("meta")


_local = threading.local()


@contextlib.contextmanager
def tiled_gemms() -> Iterator[None]:
    """In this thread, compute every projection of this module over fixed-shape row tiles (a
    row's bytes then never depend on its batch mates). Thread-local, re-entrant."""
    with thread_setting(_local, "tiled", True):
        yield


def gemm_tile(device: torch.device) -> int:
    """Rows per GEMM tile inside `tiled_gemms` on `device`."""
    return CUDA_GEMM_TILE if device.type == "cuda" else CPU_GEMM_TILE


def _tiles_active() -> bool:
    """Not under portable kernels: their exact products round each row on its own scale, so no
    row ever depends on its batch mates (and the portable domain's bytes stay as they are)."""
    return getattr(_local, "tiled", False) and not portable_active()


def stable_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """`F.linear` over the last axis with a row-count-independent GEMM: inside `tiled_gemms`
    over fixed row tiles, outside one GEMM of at least `MIN_GEMM_ROWS` rows."""
    rows = x.reshape(-1, x.shape[-1])
    if _tiles_active():
        out = _tiled_gemm(rows, weight, bias, gemm_tile(x.device))
    else:
        out = _padded_gemm(rows, weight, bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _pad_rows(rows: Tensor, total: int) -> Tensor:
    """rows (M, K) with zero rows appended up to `total`, contiguous (a transposed view would
    select a different GEMM kernel)."""
    if rows.shape[0] < total:
        return torch.cat([rows, rows.new_zeros((total - rows.shape[0], rows.shape[1]))])
    return rows.contiguous()


def _padded_gemm(rows: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """One GEMM over every row, at least MIN_GEMM_ROWS of them."""
    count = rows.shape[0]
    return F.linear(_pad_rows(rows, max(count, MIN_GEMM_ROWS)), weight, bias)[:count]


def _tiled_gemm(rows: Tensor, weight: Tensor, bias: Tensor | None, tile: int) -> Tensor:
    """rows (M, K) through one batched GEMM of ceil(M / tile) tiles of `tile` rows each."""
    count = rows.shape[0]
    tiles = max(1, -(-count // tile))
    padded = _pad_rows(rows, tiles * tile).reshape(tiles, tile, rows.shape[1])
    weights = weight.t().expand(tiles, -1, -1)
    if bias is None:
        out = torch.bmm(padded, weights)
    else:
        out = torch.baddbmm(bias.expand(tiles, tile, -1), padded, weights)
    return out.reshape(tiles * tile, -1)[:count]


class StableLinear(nn.Linear):
    """nn.Linear (same parameters and names) computed with `stable_linear`; built on meta."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias=bias, device=META)

    def forward(self, x: Tensor) -> Tensor:
        return stable_linear(x, self.weight, self.bias)


class StableConv1d(nn.Conv1d):
    """nn.Conv1d (stride 1, no padding, no dilation, no groups) as im2col + `stable_linear`."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size, device=META)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C_in, T) -> (B, C_out, T - kernel_size + 1)."""
        kernel = self.weight.shape[2]
        frames = x.unfold(2, kernel, 1)  # (B, C_in, T_out, k)
        columns = frames.permute(0, 2, 1, 3).reshape(x.shape[0], -1, x.shape[1] * kernel)
        weight = self.weight.reshape(self.weight.shape[0], -1)  # (C_out, C_in * k)
        return stable_linear(columns, weight, self.bias).transpose(1, 2)


def layer_norm(size: int, eps: float = 1e-5, affine: bool = True) -> nn.LayerNorm:
    return nn.LayerNorm(size, eps=eps, elementwise_affine=affine, device=META)


def parameter(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, device=META))


def stable_matmul(a: Tensor, b: Tensor) -> Tensor:
    """Batched `a @ b`, (..., M, K) x (..., K, N), with a batch-count-independent GEMM per matrix.

    Batched matmul picks its kernel from the whole problem: with M < 16 or N < 16 a matrix's
    result changes with the number of matrices in the batch. Zero-padding M and N to at least
    `MIN_GEMM_ROWS` (and slicing the padding off) removes that dependence, so the leading axis
    needs no split inside `tiled_gemms` (one batched call computes each matrix alone).
    """
    return _padded_matmul(a, b)


def _padded_matmul(a: Tensor, b: Tensor) -> Tensor:
    rows, cols = a.shape[-2], b.shape[-1]
    if rows < MIN_GEMM_ROWS:
        a = torch.cat([a, a.new_zeros((*a.shape[:-2], MIN_GEMM_ROWS - rows, a.shape[-1]))], -2)
    if cols < MIN_GEMM_ROWS:
        b = torch.cat([b, b.new_zeros((*b.shape[:-1], MIN_GEMM_ROWS - cols))], -1)
    return torch.matmul(a.contiguous(), b.contiguous())[..., :rows, :cols]


def softmax_keys(scores: Tensor, keys: Tensor | None) -> Tensor:
    """softmax over the last axis of (B, H, Tq, Tk) scores; with a (B, Tk) key mask (a ragged
    batch, vocoder.flow.rows) the masked keys get no weight."""
    if keys is not None:
        scores = scores.masked_fill(~keys[:, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1)


def attend(q: Tensor, k: Tensor, v: Tensor, keys: Tensor | None = None) -> Tensor:
    """Scaled dot-product attention, (..., Tq, D) x (..., Tk, D) -> (..., Tq, D), unmasked
    unless a (B, Tk) key mask is given."""
    scores = stable_matmul(q, k.transpose(-2, -1))
    weights = softmax_keys(scores * (1.0 / math.sqrt(q.shape[-1])), keys)
    return stable_matmul(weights, v)
