"""Which kernels decide the vocoder's bytes: `native` (torch's own) or `portable` (the same bytes
on every x86-64 CPU), per thread by `kernel_scope` (docs/determinism.md, "Portable kernels")."""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Iterator

from codeclog.vocoder.errors import parse_choice


class Kernels(enum.Enum):
    NATIVE = "native"
    PORTABLE = "portable"

    @classmethod
    def parse(cls, value: str | Kernels) -> Kernels:
        return parse_choice(cls, value, "kernels")


_local = threading.local()


def portable_active() -> bool:
    """True inside a portable kernel_scope of this thread (constants built at construction, such
    as the STFT and cross-fade windows, are then computed portably too)."""
    return bool(getattr(_local, "depth", 0))


@contextlib.contextmanager
def kernel_scope(kernels: str | Kernels) -> Iterator[None]:
    """Run the block with `kernels`; native is a no-op. Thread-local, re-entrant."""
    if Kernels.parse(kernels) is Kernels.NATIVE:
        yield
        return
    from codeclog.vocoder.kernels.portable import PortableKernels  # torch dispatch: imported on use

    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        if _local.depth > 1:
            yield
        else:
            with PortableKernels():
                yield
    finally:
        _local.depth -= 1
