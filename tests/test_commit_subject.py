"""scripts/check_commit_subject.py, the commit-msg hook: a subject of at most 72 characters, as
`git log --format=%s` prints it; and .pre-commit-config.yaml runs what `make test` lints."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_commit_subject.py"

_spec = importlib.util.spec_from_file_location("check_commit_subject", SCRIPT)
assert _spec is not None and _spec.loader is not None
hook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hook)


def test_a_subject_of_72_characters_passes_and_73_is_refused() -> None:
    assert hook.problem("x" * 72 + "\n\n" + "a body line far longer than the subject " * 5) is None
    refused = hook.problem("x" * 73 + "\n")
    assert refused is not None and "73 characters, at most 72" in refused


def test_the_subject_is_the_first_paragraph_as_git_prints_it() -> None:
    message = "# a comment git leaves out\n\nFirst line\nwrapped on\n\nThe body.\n"
    assert hook.subject(message) == "First line wrapped on"
    wrapped = "A subject of fifty characters, more or less, that\nthe writer wrapped on two lines\n"
    assert hook.problem(wrapped) is not None  # git joins them: %s is 81 characters


def test_autosquash_subjects_pass_and_an_empty_message_is_left_to_git() -> None:
    assert hook.problem("fixup! " + "x" * 80) is None
    assert hook.problem("squash! " + "x" * 80) is None
    assert hook.problem("# only comments\n\n") is None


def test_the_hook_exits_1_with_the_reason_and_0_for_a_short_subject(tmp_path: Path) -> None:
    long, short = tmp_path / "long", tmp_path / "short"
    long.write_text("y" * 90 + "\n\nbody\n")
    short.write_text("A short subject\n\nbody\n")
    run = [sys.executable, str(SCRIPT)]
    refused = subprocess.run([*run, str(long)], capture_output=True, text=True, check=False)
    assert refused.returncode == 1 and "90 characters, at most 72" in refused.stderr
    assert subprocess.run([*run, str(short)], check=False).returncode == 0


def _make_test_lints() -> list[str]:
    """The lint commands of the Makefile's `test` target, its tools named by their venv path."""
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe is not None
    commands = [line.strip() for line in recipe.group(1).splitlines()]
    return [
        c.replace("$(PY)", "bin/python").replace("$(VENV)/bin/", "bin/")
        for c in commands
        if "pytest" not in c
    ]


def test_the_pre_commit_configuration_runs_what_make_test_lints() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    run_by_hooks = []
    for each in hooks:
        argv = shlex.split(each["entry"])
        command = argv[2] if argv[:2] == ["bash", "-c"] else each["entry"]
        # '"${CODECLOG_VENV:-...}/bin/python" -m mypy' -> 'bin/python -m mypy'
        run_by_hooks.append(re.sub(r"^\"\$\{CODECLOG_VENV:-[^}]*\}/([^\"]*)\"", r"\1", command))
    lints = _make_test_lints()
    assert len(lints) == 4
    assert [lint for lint in lints if lint not in run_by_hooks] == []
    (subject_hook,) = [h for h in hooks if h.get("stages") == ["commit-msg"]]
    assert subject_hook["entry"].endswith("scripts/check_commit_subject.py")
