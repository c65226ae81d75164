"""The dependency direction of the whole tree: the import-linter contracts in pyproject.toml.

`make test` runs `lint-imports` on the tree; these tests show that the contracts hold and that
each kind of violation breaks them, on a copy of the tree with probe modules added.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import ROOT, run_in_tree

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# (probe module, its source, the contract that must report it)
PROBES = [
    ("codeclog/consumers/stream/fold/_probe_torch.py", "import torch\n", "The fold is pure"),
    (
        "codeclog/consumers/stream/fold/_probe_wire.py",
        "from codeclog.schemas import wire\n",
        "The fold is pure",
    ),
    ("codeclog/vocoder/_probe_kafka.py", "import confluent_kafka\n", "The vocoder is the model"),
    (
        "codeclog/vocoder/_probe_records.py",
        "from codeclog.schemas.records import CodecChunk\n",
        "The vocoder is the model",
    ),
    ("codeclog/vocoder/_probe_up.py", "import codeclog.consumers.stream.pipeline\n", "Layers"),
    ("codeclog/consumers/_probe_cli.py", "import codeclog.cli.commands.vocode\n", "Layers"),
    ("codeclog/schemas/_probe_up.py", "import codeclog.kafka.topics\n", "Layers"),
    (
        "codeclog/producers/_probe_sibling.py",
        "import codeclog.consumers.member.service\n",
        "Layers",
    ),
    ("codeclog/kafka/_probe_up.py", "import codeclog.consumers.member.service\n", "Layers"),
    ("codeclog/omni/_probe_tooling.py", "import codeclog.devtools.cluster\n", "Layers"),
    # appended to an existing module (the contract names modules, not a package)
    ("codeclog/producers/talker.py", "import confluent_kafka\n", "The talker imports no Kafka"),
    ("codeclog/devtools/audit.py", "import codeclog.schemas.wire\n", "The audit and the history"),
    (
        "codeclog/devtools/history.py",
        "import codeclog.consumers.stream.fold\n",
        "The audit and the history",
    ),
]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} missing: install codeclog[dev] (import-linter)")
    return run_in_tree([str(LINT_IMPORTS), "--no-cache"], timeout_s=240, root=root)


def test_the_tree_keeps_every_contract() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_each_kind_of_violation_breaks_its_contract(tmp_path: Path) -> None:
    # The copy resolves the package links (codeclog/consumers -> ../consumers, ...) into files.
    shutil.copytree(ROOT / "codeclog", tmp_path / "codeclog", ignore=_caches)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for path, source, _ in PROBES:
        target = tmp_path / path
        target.write_text((target.read_text() if target.exists() else "") + source)
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    report = result.stdout
    for path, _, contract in PROBES:
        module = path.removesuffix(".py").replace("/", ".")
        assert module in report, f"{module} not reported:\n{report[-4000:]}"
        section = report[report.index("Broken contracts") :]
        assert contract in section
    assert "0 kept" in report  # every contract has a probe that breaks it


def _caches(directory: str, names: list[str]) -> set[str]:
    return {name for name in names if name in {"__pycache__", "fixtures_cache"}}


def test_the_connector_and_the_service_load_neither_the_tooling_nor_the_command_line() -> None:
    """A vLLM environment imports the connector or runs the vocode service: neither may load
    the local Kafka tooling (broker, cluster, security, jars, the stack harness) or the CLI."""
    code = (
        "import sys, codeclog.omni.connector, codeclog.consumers.member.service\n"
        "print(sorted(m for m in sys.modules if m.startswith(('codeclog.devtools', "
        "'codeclog.cli'))))"
    )
    result = run_in_tree([sys.executable, "-c", code], timeout_s=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
