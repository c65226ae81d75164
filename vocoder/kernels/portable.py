"""Portable kernels: the dispatch mode that owns the vocoder's numerically sensitive torch ops, so
that the audio bytes are the same on every x86-64 CPU (docs/determinism.md, "Portable kernels")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from codeclog.vocoder.errors import PortableKernelError
from codeclog.vocoder.kernels import elementwise, factories, products, reductions, spectra
from codeclog.vocoder.kernels.products import IntegerProducts

aten = torch.ops.aten


# Ops whose native results are the same bits on every CPU (exact, or one IEEE operation).
_EXACT = {
    aten.reshape.default, aten.view.default, aten.view.dtype, aten._unsafe_view.default,
    aten.slice.Tensor, aten.select.int, aten.transpose.int, aten.t.default, aten.permute.default,
    aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.squeeze.dims,
    aten.expand.default, aten.expand_as.default, aten.view_as.default, aten.alias.default,
    aten.unfold.default, aten.chunk.default, aten.split.Tensor, aten.split_with_sizes.default,
    aten.unbind.int, aten.movedim.int, aten.as_strided.default, aten.flip.default,
    aten.roll.default, aten.transpose_.default,
    aten.cat.default, aten.stack.default, aten.contiguous.default, aten.clone.default,
    aten.copy_.default, aten.detach.default, aten.detach_.default, aten.lift_fresh.default,
    aten.resolve_conj.default, aten.resolve_neg.default, aten.complex.default,
    aten.view_as_real.default, aten.view_as_complex.default, aten.real.default,
    aten.to.device, aten.to.dtype, aten.to.dtype_layout, aten._to_copy.default,
    aten.zeros.default, aten.zeros_like.default, aten.ones.default, aten.ones_like.default,
    aten.empty.memory_format, aten.empty_like.default, aten.full.default, aten.full_like.default,
    aten.new_zeros.default, aten.new_ones.default, aten.new_empty.default, aten.new_full.default,
    aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default, aten.scalar_tensor.default,
    aten.index.Tensor, aten.index_select.default, aten.gather.default, aten.embedding.default,
    aten.index_put_.default, aten.masked_fill.Scalar, aten.masked_fill_.Scalar, aten.where.self,
    aten.repeat.default, aten.repeat_interleave.self_int, aten.constant_pad_nd.default,
    aten.pad.default, aten.reflection_pad1d.default, aten.replication_pad1d.default,
    aten.item.default, aten._local_scalar_dense.default, aten.sym_size.int,
    aten.mul.Tensor, aten.mul.Scalar, aten.mul_.Tensor, aten.mul_.Scalar, aten.multiply.Tensor,
    aten.div.Tensor, aten.div.Scalar, aten.div_.Tensor, aten.div_.Scalar, aten.neg.default,
    aten.sqrt.default, aten.abs.default, aten.sign.default, aten.reciprocal.default,
    aten.floor.default, aten.ceil.default, aten.round.default, aten.trunc.default,
    aten.frexp.Tensor, aten.bitwise_left_shift.Tensor_Scalar, aten.remainder.Scalar,
    aten.remainder.Tensor, aten.fmod.Scalar,
    aten.clamp.default, aten.clamp.Tensor, aten.clip.default, aten.clamp_min.default,
    aten.clamp_max.default, aten.maximum.default, aten.minimum.default,
    aten.max.default, aten.min.default, aten.amax.default, aten.amin.default,
    aten.max.dim, aten.min.dim, aten.argmax.default,
    aten.gt.Scalar, aten.gt.Tensor, aten.lt.Scalar, aten.lt.Tensor, aten.ge.Scalar,
    aten.ge.Tensor, aten.le.Scalar, aten.le.Tensor, aten.eq.Scalar, aten.eq.Tensor,
    aten.ne.Scalar, aten.ne.Tensor, aten.logical_not.default, aten.logical_and.default,
    aten.bitwise_and.Tensor, aten.any.default, aten.all.default, aten.isnan.default,
    aten.leaky_relu.default, aten.relu.default, aten.upsample_nearest1d.vec,
    aten.rand.generator, aten.uniform_.default, aten.randint.generator, aten.randint.low_generator,
}  # fmt: skip


def _handlers(gemm: IntegerProducts | None) -> dict[Any, Callable[..., Any]]:
    """Every replaced op's kernel, from the module that owns it."""
    return {
        **elementwise.HANDLERS,
        **reductions.HANDLERS,
        **products.handlers(gemm),
        **spectra.HANDLERS,
        **factories.HANDLERS,
    }


class PortableKernels(TorchDispatchMode):
    """Run the enclosed torch code with the portable kernels (docs/determinism.md, "Portable
    kernels"). Thread-local: enter it in every thread that computes."""

    def __init__(self, gemm: IntegerProducts | None = None) -> None:
        super().__init__()
        self._handlers = _handlers(gemm)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No torch.compile runs under these kernels, so `__torch_dispatch__` is left unwrapped:
        torch's dynamo-disabling wrapper would import torch._dynamo on the first op (about 3 s
        of start-up, a minute under qemu) and add a call to every op."""
        return False

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        handler = self._handlers.get(func)
        if handler is not None:
            return handler(*args, **kwargs)
        if func in _EXACT:
            return func(*args, **kwargs)
        raise PortableKernelError(
            f"{func} has no portable kernel: its result could differ by CPU "
            "(add a kernel in vocoder/kernels/, or use --kernels native)"
        )
