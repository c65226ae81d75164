"""The portable kernels (vocoder.kernels): close to torch's native ops, independent of the
summation order, refusing what they do not own, and the same bytes for any thread count or batch.

The cross-CPU proof (the same bytes under emulated Intel and AMD CPUs) is in
test_cross_cpu.py; these tests pin the properties that make it hold.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from codeclog.vocoder.engine import Code2WavEngine, pcm_s16le, stream_seed
from codeclog.vocoder.errors import PortableKernelError, VocoderConfigError
from codeclog.vocoder.flow import canonical_windows
from codeclog.vocoder.kernels import Kernels, kernel_scope, portable_active
from codeclog.vocoder.kernels import exactmath as em
from codeclog.vocoder.kernels.products import matmul_exact as _matmul_exact

pytestmark = pytest.mark.vocoder
F64 = torch.float64


def portable(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    with kernel_scope("portable"):
        return fn(*args, **kwargs)


@pytest.mark.parametrize(
    ("ours", "theirs", "low", "high"),
    [
        (em.exp, torch.exp, -700.0, 700.0),
        (em.expm1, torch.expm1, -5.0, 5.0),
        (em.log, torch.log, 1e-300, 1e300),
        (em.sin, torch.sin, -2e4, 2e4),
        (em.cos, torch.cos, -2e4, 2e4),
        (em.tanh, torch.tanh, -30.0, 30.0),
        (em.sigmoid, torch.sigmoid, -40.0, 40.0),
    ],
)
def test_exactmath_matches_float64_libm(ours, theirs, low, high) -> None:  # type: ignore[no-untyped-def]
    generator = torch.Generator().manual_seed(1)
    if low > 0:  # log-uniform over the positive range
        x = torch.exp(
            torch.empty(20000, dtype=F64).uniform_(
                math.log(low), math.log(high), generator=generator
            )
        )
    else:
        x = torch.empty(20000, dtype=F64).uniform_(low, high, generator=generator)
    x = torch.cat([x, torch.tensor([0.0, 1e-8, -1e-8, 0.5, -0.5], dtype=F64).clamp(low, high)])
    expected, got = theirs(x), ours(x)
    scale = expected.abs().clamp(min=1e-300)
    worst = float(((got - expected).abs() / scale).max())
    assert worst < 1e-11, worst  # far finer than the float32 results rounded from them


def test_log_edges() -> None:
    x = torch.tensor([0.0, -1.0, 1.0], dtype=F64)
    out = em.log(x)
    assert out[0] == -math.inf and math.isnan(out[1]) and out[2] == 0.0


def _close(native: torch.Tensor, ours: torch.Tensor, rtol: float = 2e-5) -> None:
    assert ours.dtype == native.dtype and ours.shape == native.shape
    scale = float(native.abs().max()) or 1.0
    assert float((ours - native).abs().max()) <= rtol * scale


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    """Inputs from numpy, so that the native and the portable run see the same values."""
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return torch.from_numpy(values)


HANN16 = torch.from_numpy((0.5 - 0.5 * np.cos(2 * np.pi * np.arange(16) / 16)).astype(np.float32))
UNIFORM = torch.from_numpy(np.random.default_rng(3).random((3, 400)).astype(np.float32))


@pytest.mark.parametrize(
    "case",
    [
        lambda: F.linear(_randn(3, 5, 32), _randn(16, 32, seed=1), _randn(16, seed=2)),
        lambda: torch.matmul(_randn(2, 4, 7, 16), _randn(2, 4, 16, 9, seed=1)),
        lambda: torch.matmul(_randn(7, 16), _randn(16, seed=1)),
        lambda: F.conv1d(_randn(2, 8, 50), _randn(6, 8, 5, seed=1), _randn(6, seed=2), 1, 2),
        lambda: F.conv1d(_randn(2, 8, 50), _randn(8, 1, 3, seed=1), None, 1, 2, 2, 8),
        lambda: F.conv_transpose1d(
            _randn(2, 8, 20), _randn(8, 4, 6, seed=1), _randn(4, seed=2), 3, 1
        ),
        lambda: F.layer_norm(_randn(3, 7, 24), (24,), _randn(24, seed=1), _randn(24, seed=2)),
        lambda: torch.softmax(_randn(3, 4, 19) * 4, dim=-1),
        lambda: F.gelu(_randn(4, 33) * 3, approximate="tanh"),
        lambda: F.silu(_randn(4, 33) * 5),
        lambda: F.mish(_randn(4, 33) * 8),
        lambda: F.elu(_randn(4, 33) * 3),
        lambda: torch.tanh(_randn(4, 33) * 3),
        lambda: torch.exp(_randn(4, 33) * 3),
        lambda: torch.sin(_randn(4, 33) * 300),
        lambda: torch.pow(_randn(4, 33), 2),
        lambda: torch.cumsum(UNIFORM, dim=1),
        lambda: F.interpolate(_randn(2, 9, 4800), scale_factor=1 / 480, mode="linear"),
        lambda: F.interpolate(_randn(2, 9, 30), scale_factor=480.0, mode="linear"),
        lambda: F.normalize(_randn(1, 192), dim=1),
        lambda: torch.linspace(0, 1, 11),
        lambda: torch.arange(0.5, 7.25, 0.75),
        # stft/istft as the engine runs them (inference mode keeps them whole ops)
        torch.inference_mode()(
            lambda: torch.view_as_real(
                torch.stft(_randn(2, 400), 16, 4, 16, HANN16, return_complex=True)
            )
        ),
        torch.inference_mode()(
            lambda: torch.istft(
                torch.complex(_randn(2, 9, 40), _randn(2, 9, 40, seed=1)), 16, 4, 16, HANN16
            )
        ),
        lambda: torch.view_as_real(torch.fft.rfft(_randn(3, 16), dim=-1)),
        lambda: torch.fft.irfft(torch.complex(_randn(3, 9), _randn(3, 9, seed=1)), n=16, dim=-1),
    ],
)
def test_portable_op_is_native_up_to_float32_rounding(case) -> None:  # type: ignore[no-untyped-def]
    _close(case(), portable(case))


@pytest.mark.parametrize("size", [16, 160, 257, 80 * 300])
def test_randn_is_torchs_draws_to_a_few_float32_ulps(size: int) -> None:
    native = torch.randn(size, generator=torch.Generator().manual_seed(size))
    ours = portable(torch.randn, size, generator=torch.Generator().manual_seed(size))
    # torch's vectorised Box-Muller works in float32 (2 pi u rounded first): ours in float64
    assert float((native - ours).abs().max()) < 4e-6


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 64), st.integers(1, 8), st.integers(1, 8), st.integers(0, 2**31))
def test_exact_products_do_not_depend_on_the_summation_order(
    k: int, m: int, n: int, seed: int
) -> None:
    """Permuting the reduction dimension changes a float32 matmul's rounding, never ours."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g) * 3)
    b = torch.randn(k, n, generator=g)
    order = torch.randperm(k, generator=g)
    assert torch.equal(_matmul_exact(a, b), _matmul_exact(a[:, order], b[order]))


def test_a_float32_matmul_does_depend_on_the_order() -> None:
    """Control for the property above: the native kernel is order-sensitive on this data."""
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(64, 512, generator=g), torch.randn(512, 64, generator=g)
    order = torch.randperm(512, generator=g)
    assert not torch.equal(a @ b, a[:, order] @ b[order])


def test_an_op_without_a_portable_kernel_is_refused() -> None:
    with pytest.raises(PortableKernelError, match="no portable kernel"):
        portable(torch.erf, torch.ones(3))
    with pytest.raises(PortableKernelError, match="erf"):
        portable(F.gelu, torch.ones(3))  # exact gelu needs erf


def test_scope_is_thread_local_and_reentrant() -> None:
    assert not portable_active()
    with kernel_scope("portable"):
        with kernel_scope(Kernels.PORTABLE):
            assert portable_active()
        assert portable_active()
    assert not portable_active()
    with pytest.raises(VocoderConfigError):
        Kernels.parse("fast")


def _stream_pcm(engine: Code2WavEngine, ids: list[int], seed: int) -> bytes:
    state = engine.setup(seed=seed)
    pcm = b""
    for window, final in canonical_windows(ids):
        [(audio, state)] = engine.decode_batch([(state, window, final)])
        pcm += pcm_s16le(audio)
    return pcm


IDS = [4218] * 3 + [(i * 7919 + 13) % 6561 for i in range(40)]


def test_portable_bytes_do_not_depend_on_the_thread_count() -> None:
    one = Code2WavEngine.tiny(kernels="portable", threads=1, workers=1)
    first = _stream_pcm(one, IDS, stream_seed("threads", 0))
    two = Code2WavEngine.tiny(kernels="portable", threads=2, workers=2)
    assert _stream_pcm(two, IDS, stream_seed("threads", 0)) == first
    torch.set_num_threads(1)


def test_portable_batch_equals_solo() -> None:
    engine = Code2WavEngine.tiny(kernels="portable", workers=1)
    seeds = [stream_seed(f"r{i}", 0) for i in range(3)]
    solo = [engine.decode_batch([(engine.setup(seed=s), IDS[:28], False)])[0][0] for s in seeds]
    batch = engine.decode_batch([(engine.setup(seed=s), IDS[:28], False) for s in seeds])
    for alone, (together, _) in zip(solo, batch, strict=True):
        assert np.array_equal(alone, together)


def test_the_domain_names_the_kernels() -> None:
    engine = Code2WavEngine.tiny(kernels="portable", workers=1)
    assert engine.domain.startswith("portable1:torch")
    assert engine.describe()["kernels"] == "portable"
    native = Code2WavEngine.tiny(workers=1)
    assert native.domain.startswith("native:torch") and ":cpu:" in native.domain


def test_portable_kernels_refuse_an_accelerator() -> None:
    with pytest.raises(VocoderConfigError, match="CPU only"):
        Code2WavEngine.tiny(device="meta", kernels="portable")
