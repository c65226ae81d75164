"""Comparing two decodes of one audio window: bytewise within a determinism domain, by a
documented numeric bound across domains (docs/determinism.md, "verify's comparisons")."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import math

import numpy as np

DEFAULT_MAX_ABS_LSB = 32
DEFAULT_MIN_SNR_DB = 40.0


class Comparison(enum.Enum):
    BYTES = "bytes"  # same domain (or equal bytes): byte identity required
    BOUND = "bound"  # different domains: the numeric bound


@dataclasses.dataclass(frozen=True)
class Bound:
    max_abs_lsb: int = DEFAULT_MAX_ABS_LSB
    min_snr_db: float = DEFAULT_MIN_SNR_DB


@dataclasses.dataclass(frozen=True)
class WindowVerdict:
    comparison: Comparison
    ok: bool
    max_abs_lsb: int = 0
    snr_db: float = math.inf


def pcm_digest(pcm: bytes) -> str:
    return hashlib.sha256(pcm).hexdigest()


def compare_bytes(expected_sha256: str, actual_sha256: str) -> WindowVerdict:
    return WindowVerdict(Comparison.BYTES, expected_sha256 == actual_sha256)


def compare_bound(expected: bytes, actual: bytes, bound: Bound) -> WindowVerdict:
    """The numeric comparison of two s16le windows (equal bytes always pass)."""
    if expected == actual:
        return WindowVerdict(Comparison.BOUND, True)
    if len(expected) != len(actual):
        return WindowVerdict(Comparison.BOUND, False, max_abs_lsb=2**16, snr_db=-math.inf)
    a = np.frombuffer(expected, dtype="<i2").astype(np.int64)
    b = np.frombuffer(actual, dtype="<i2").astype(np.int64)
    difference = a - b
    worst = int(np.abs(difference).max(initial=0))
    snr = _snr_db(a, difference)
    return WindowVerdict(
        Comparison.BOUND, worst <= bound.max_abs_lsb and snr >= bound.min_snr_db, worst, snr
    )


def _snr_db(signal: np.ndarray, difference: np.ndarray) -> float:
    noise = float(np.square(difference, dtype=np.float64).sum())
    if noise == 0:
        return math.inf
    energy = float(np.square(signal, dtype=np.float64).sum())
    # a near-silent window has no meaningful SNR: judge it by the per-sample bound alone
    if energy <= noise * 1e4 and float(np.abs(signal).max(initial=0)) < 64:
        return math.inf
    return 10.0 * math.log10(energy / noise) if energy > 0 else -math.inf
