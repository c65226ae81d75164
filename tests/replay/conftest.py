"""Fixtures of the replay tests: scenario paths, synthetic captures, in-process CLI runs."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from codeclog.cli import main
from codeclog.testing.upstream_streams import realistic_events
from tests.replay.captures import write_events


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]) -> Callable[[Sequence[str]], tuple[int, str, str]]:
    """argv -> (exit code, stdout, stderr) of `codeclog` run in-process."""

    def run(argv: Sequence[str]) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture
def synthetic_capture(tmp_path: Path) -> Path:
    """A capture of 20 interleaved 2-turn sessions on 4 partitions, with transaction gaps."""
    events = realistic_events(random.Random(7), sessions=20, turns=2)
    write_events(tmp_path / "synthetic.ocf", events, 4, txn_records=5, block_records=50)
    return tmp_path / "synthetic.ocf"
