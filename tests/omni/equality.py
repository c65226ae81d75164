"""Payload equality for the omni tests: what a round trip through the log must preserve."""

from __future__ import annotations

import numpy as np
import torch


def payload_equal(a: object, b: object) -> bool:
    """Equal values of equal types, all the way down: tensors and arrays by dtype, shape and
    contents (bfloat16 compared as float32), dicts in key order, lists and tuples apart."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and (
                bool(torch.equal(a, b))
                if a.dtype != torch.bfloat16
                else bool(torch.equal(a.float(), b.float()))
            )
        )
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and list(a) == list(b) and all(payload_equal(a[k], b[k]) for k in a)
        )
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(payload_equal, a, b))  # type: ignore[arg-type]
    return type(a) is type(b) and a == b
