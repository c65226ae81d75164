"""The fold's dependency rule: no torch, Kafka, Avro or vocoder (docs/fold-contract.md).

consumers/fold/ruff.toml bans those imports (TID251); these tests show the ban bites, and that
importing the fold really loads none of them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = "consumers/fold/_probe_not_a_file.py"  # ruff picks the config by this path only


def ruff(source: str, filename: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--stdin-filename", filename, "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.parametrize(
    "source",
    [
        "import torch\n",
        "import torch.nn as nn\n",
        "from confluent_kafka import Consumer\n",
        "import fastavro\n",
        "from avro.schema import parse\n",
        "from schemas.wire import decode\n",
        "from vocoder import model\n",
    ],
)
def test_a_banned_import_in_the_fold_is_flagged(source: str) -> None:
    result = ruff(source, PROBE)
    assert result.returncode == 1 and "TID251" in result.stdout, result.stdout + result.stderr


def test_the_same_import_elsewhere_is_allowed() -> None:
    result = ruff("import fastavro\n\nfastavro.parse_schema({})\n", "replay/_probe_not_a_file.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_importing_the_fold_loads_no_heavy_dependency() -> None:
    code = (
        "import sys\n"
        "import consumers.fold.machine, consumers.fold.report, consumers.fold.scenario\n"
        "import consumers.fold.synth\n"
        "banned = ('torch', 'confluent_kafka', 'fastavro', 'avro', 'vocoder', 'schemas.wire')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in banned or m in banned))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert result.stdout.strip() == "[]"
