"""A fresh process of this checkout, for the tests that must not share the test interpreter
(import side effects, global RNG state, a copied tree)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_in_tree(
    argv: Sequence[str], timeout_s: float, root: Path = ROOT, **env: str
) -> subprocess.CompletedProcess[str]:
    """`argv` run in `root`, which it imports from (PYTHONPATH), with this environment plus
    `env`; its output captured as text. A non-zero exit is the caller's to judge."""
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root), **env},
        cwd=root,
        timeout=timeout_s,
        check=False,
    )
