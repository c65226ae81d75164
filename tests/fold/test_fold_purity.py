"""The fold's dependency rule: no torch, Kafka, Avro or vocoder (docs/fold-contract.md).

The rule is an import-linter contract in pyproject.toml (tests/test_import_layers.py shows it
bites); this test shows that importing the fold really loads none of them at run time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_fold_loads_no_heavy_dependency() -> None:
    code = (
        "import sys\n"
        "import codeclog.consumers.stream.fold.rules, codeclog.consumers.stream.fold.report\n"
        "banned = ('torch', 'confluent_kafka', 'fastavro', 'avro', 'numpy')\n"
        "ours = ('codeclog.vocoder', 'codeclog.schemas.wire')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in banned or m.startswith(ours)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert result.stdout.strip() == "[]"
