"""Where codeclog keeps its files on this machine (the jars, the local broker's data dir)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_DATA_DIR = "CODECLOG_DATA_DIR"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "codeclog"


def default_data_dir() -> Path:
    env = os.environ.get(ENV_DATA_DIR)
    return Path(env) if env else default_cache_dir() / "broker"
