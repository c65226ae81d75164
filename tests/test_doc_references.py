"""No document points at nothing: every relative link of the README and docs/, and every `.md`
file named there or in the code's docstrings and comments, is a file of the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = (
    "cli devtools kafka testing codeclog omni replay lag consumers producers schemas vocoder bench"
)
# a `.md` file a program writes (named where the code writes it, not a document to read)
WRITTEN = {"device_check.md"}
MD_NAME = re.compile(r"(?<![\w/.-])((?:\.\./|\./)?[\w][\w./-]*\.md)\b")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _sources() -> list[Path]:
    return [
        path
        for folder in LAYERS.split()
        for path in sorted((ROOT / folder).rglob("*.py"))
        if not path.is_symlink() and "__pycache__" not in path.parts
    ]


def _exists(reference: str, where: Path, names: set[str]) -> bool:
    candidates = [(where.parent / reference), (ROOT / reference)]
    if any(c.exists() for c in candidates):
        return True
    return "/" not in reference and reference in names


def test_every_md_file_named_in_the_docs_and_the_code_exists() -> None:
    names = {p.name for p in ROOT.rglob("*.md") if ".git" not in p.parts} | WRITTEN
    missing = [
        f"{path.relative_to(ROOT)}: {match.group(1)}"
        for path in _documents() + _sources()
        for match in MD_NAME.finditer(path.read_text())
        if not _exists(match.group(1), path, names)
    ]
    assert missing == []


def test_every_relative_link_of_the_docs_exists() -> None:
    missing = [
        f"{path.relative_to(ROOT)}: {match.group(1)}"
        for path in _documents()
        for match in LINK.finditer(path.read_text())
        if "://" not in match.group(1)
        and not match.group(1).startswith("mailto:")
        and not (path.parent / match.group(1)).exists()
    ]
    assert missing == []
