"""Batch-invariant building blocks: a request's numbers never depend on its batch mates.

A batched decode must give every request exactly the bytes it would get alone, because the
consumer's live (batched) audio is compared with an offline replay (batch of one). On CPU the
stock kernels break that in four places (measured with torch 2.15 / MKL 2024.2 / oneDNN 3.13;
see tests/vocoder/test_flow_batching.py):

- `F.linear` takes a different GEMM path when the row count M is small (M < 12 and not a
  multiple of 4 differ from M >= 12 in the last bits on the AVX2 CPU first measured), e.g. the
  adaLN rows (M = 2 per request) or a short final window;
- on an Intel AVX2 CPU (measured under `qemu-x86_64 -cpu Haswell-v4`) MKL's GEMM gives a row
  different last bits at M = 25 and M = 100 as well (the encoder's pre-lookahead convolution of
  the tiny model: K = 128, N = 32), so no row count is safe there;
- `F.conv1d` takes a different oneDNN path at batch 1 than at batch >= 2;
- batched `torch.matmul` with fewer than 16 rows or columns per matrix gives a matrix different
  bits depending on how many matrices are in the batch (e.g. attention of a 1-id final window).

So every projection is a row-major GEMM over at least `MIN_GEMM_ROWS` rows (zero rows padded
and dropped), every convolution is an explicit im2col followed by that GEMM, and attention is
written out (no fused SDPA kernel) with every batched matmul padded to at least 16 rows and
columns. Inside `per_row_gemms()` (the engine enters it when it is batch-invariant, the default
on CPU) each GEMM is further computed once per index of the leading (batch) axis, so a request's
rows go through a GEMM of exactly the shape they have in a solo decode, whatever the CPU's
kernels do with the row count. Outside it (a GPU engine) one call covers the whole batch.

"Once per index" is one batched GEMM call (`torch.baddbmm` / `torch.matmul` over a leading
axis), not a Python loop: a batched GEMM computes each of its matrices as a lone GEMM of that
matrix's shape, so every matrix gets the bytes of the one-matrix call whatever the batch count
(checked bytewise for the GEMM shapes of the tiny model and of the published one, at batch counts
up to 32, fewer for the largest published shapes: natively on an AVX-512 Intel CPU and under
`qemu-x86_64 -cpu Haswell-v4`, where the row-count dependence above is real; not under an
emulated AMD CPU; tests/vocoder/test_flow_batching.py checks it on the machine that runs it). The
loop of one call per row it replaced cost the tiny flow 1.7x at batch 16.
"""

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

# Every weight is allocated on the meta device (no memory, no initialisation, no RNG) and then
# materialised and initialised once, from a seeded generator, by Token2WavFlow.
META = torch.device("meta")


_local = threading.local()


@contextlib.contextmanager
def per_row_gemms() -> Iterator[None]:
    """In this thread, compute every GEMM of this module once per index of the leading axis (a
    request's rows, or one of its classifier-free-guidance rows). Thread-local, re-entrant."""
    with thread_setting(_local, "per_row", True):
        yield


def _per_row_active(x: Tensor) -> bool:
    """One GEMM matrix per index of x's leading axis. Not under portable kernels: their exact
    products round each row on its own scale, so no row ever depends on its batch mates."""
    per_row = getattr(_local, "per_row", False) and x.dim() >= 2 and x.shape[0] >= 2
    return per_row and not portable_active()


def stable_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """`F.linear` over the last axis with a row-count-independent GEMM; inside `per_row_gemms`
    one GEMM matrix per index of the leading axis."""
    matrices = x.shape[0] if _per_row_active(x) else 1
    rows = x.reshape(matrices, -1, x.shape[-1])
    count = rows.shape[1]
    if count < MIN_GEMM_ROWS:
        pad = rows.new_zeros((matrices, MIN_GEMM_ROWS - count, rows.shape[2]))
        rows = torch.cat([rows, pad], dim=1)
    else:
        rows = rows.contiguous()  # a transposed view would select a different GEMM kernel
    if matrices == 1:
        out = F.linear(rows[0], weight, bias)[None]
    else:  # each matrix as F.linear computes it alone (see the module doc)
        weights = weight.t().expand(matrices, -1, -1)
        if bias is None:
            out = torch.bmm(rows, weights)
        else:
            out = torch.baddbmm(bias.expand(matrices, rows.shape[1], -1), rows, weights)
    return out[:, :count].reshape(*x.shape[:-1], weight.shape[0])


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
    needs no split inside `per_row_gemms` (one batched call computes each matrix alone).
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
