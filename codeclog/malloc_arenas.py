"""A member's heap in at most MEMBER_ARENAS glibc malloc arenas (torch- and Kafka-free).
Reasons: docs/operating.md, "Memory and bounds"."""

from __future__ import annotations

import ctypes
import os

MEMBER_ARENAS = 2
ENV_ARENA_MAX = "MALLOC_ARENA_MAX"  # glibc's own variable: when set, the operator's value stands
M_ARENA_MAX = -8  # mallopt's parameter number (glibc malloc.h)


def cap_arenas(count: int = MEMBER_ARENAS) -> bool:
    """At most `count` arenas from now on: call it before the process starts other threads
    (glibc fixes its arena limit when a thread first needs an arena of its own). Does nothing
    when MALLOC_ARENA_MAX is set or the C library has no mallopt; True when the cap was set."""
    if os.environ.get(ENV_ARENA_MAX):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, count))
