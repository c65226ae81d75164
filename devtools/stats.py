"""The one percentile of the demo's and the benchmarks' latency figures."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float, empty: float = math.nan) -> float:
    """The `q`-th percentile of `values` (numpy's linear interpolation); `empty` when none."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else empty
