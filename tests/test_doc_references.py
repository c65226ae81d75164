"""No document points at nothing: every relative link of the README and docs/, and every `.md`
file named there or in the code's docstrings and comments, is a file of the repository; every
section such a pointer names is a heading of that file; every module the prose names in
backticks is a module, or an attribute of one, of this checkout."""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = (
    "cli devtools kafka testing codeclog omni replay lag consumers producers schemas vocoder bench"
)
# a `.md` file a program writes (named where the code writes it, not a document to read)
WRITTEN = {"device_check.md"}
MD_NAME = re.compile(r"(?<![\w/.-])((?:\.\./|\./)?[\w][\w./-]*\.md)\b")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")

# A pointer at a section: a file, then its section's title in double quotes, as the prose writes
# it: `docs/operating.md, "Liveness bounds"`, `README "Exit codes"`, `x.md ("Ragged batching")`,
# `x.md, section "Size"`. A bare `section "..."` in a Markdown file names one of its own.
SECTION_REF = re.compile(
    r"(?<![\w/.-])(?P<file>(?:\.\./|\./)?[\w][\w./-]*\.(?:md|py)|README)"
    r"(?:,\s*|\s*\(\s*|\s+)(?:section\s+)?\"(?P<section>[^\"]{1,200})\""
)
OWN_SECTION = re.compile(r"(?<![\w.])section\s+\"(?P<section>[^\"]{1,200})\"")
# a line break inside prose, with what carries a comment or a quote on to the next line
LINE_BREAK = re.compile(r"[ \t]*\n[ \t]*(?:#+[ \t]?|>[ \t]?)?")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$")
FENCE = re.compile(r"^[ \t]*(```|~~~)")
NUMBERING = re.compile(r"^(?:§\s*)?(?:\d+(?:\.\d+)*\.?\s+)?")
# a dotted name in backticks: `codeclog.omni.redispatch`, `omni.relay.AudioRelayClient`, `f()`
DOTTED = re.compile(r"`((?:[A-Za-z_]\w*)(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")
# dotted names that are not Python (the Avro schemas' full names are read from schemas/avro/)
NOT_PYTHON = {
    "codeclog.payload": "a Kafka header's name (omni/payload.py, HEADER)",
    "kafka.Kafka": "the broker JVM's main class",
    "replay.lanes": "a module issue 30 removed, named as gone in BENCHMARKS.md's log",
}


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


# --- sections ---------------------------------------------------------------------------------


def _pointing_texts() -> list[Path]:
    """Every file whose prose may point at a section: the documents, the code and the tests
    (this file aside: its comments show the forms), the deploy files an operator reads."""
    deploy = [
        p
        for p in sorted((ROOT / "deploy").rglob("*"))
        if p.suffix in {".md", ".yml", ".yaml"} and p.is_file()
    ]
    tests = [
        p
        for p in sorted((ROOT / "tests").rglob("*"))
        if p.suffix in {".py", ".md"} and "__pycache__" not in p.parts and p != Path(__file__)
    ]
    return _documents() + _sources() + deploy + tests


def _prose(path: Path) -> str:
    """The file with its line breaks (and the `#` or `>` that continue a comment or a quote)
    folded into spaces, so that a title quoted across two lines reads as one."""
    return LINE_BREAK.sub(" ", path.read_text())


def _normalise(title: str) -> str:
    title = re.sub(r"[`*]", "", title)
    title = re.sub(r"\s+", " ", title).strip().lower()
    return NUMBERING.sub("", title)


@functools.cache
def _headings(path: Path) -> tuple[str, ...]:
    """A Markdown file's headings (outside code blocks), normalised."""
    found: list[str] = []
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = HEADING.match(line)
        if match and not fenced:
            found.append(_normalise(match.group(1)))
    return tuple(found)


def _titles(heading: str) -> set[str]:
    """The names a heading answers to: itself, and the parts before and after its first colon
    ("Issue 61: batch invariance over fixed GEMM tiles" is "Issue 61" too)."""
    before, colon, after = heading.partition(":")
    return {heading} | ({before.strip(), after.strip()} if colon else set())


def _has_section(target: Path, section: str) -> bool:
    """Whether `section` names a heading of the Markdown file `target` (its whole title, its
    part before or after the colon, or their first words), or, for a Python file, text in it."""
    cited = _normalise(section)
    if target.suffix == ".py":
        return cited in _normalise(_prose(target))
    return any(
        title == cited or title.startswith(cited + " ")
        for heading in _headings(target)
        for title in _titles(heading)
    )


def _target(reference: str, where: Path) -> Path | None:
    if reference == "README":
        return ROOT / "README.md"
    for candidate in (where.parent / reference, ROOT / reference):
        if candidate.is_file():
            return candidate
    by_name = [p for p in (*_documents(), *_sources()) if p.name == reference]
    return by_name[0] if "/" not in reference and len(by_name) == 1 else None


def _section_references(path: Path) -> Iterator[tuple[Path | None, str]]:
    text = _prose(path)
    spans: list[range] = []
    for match in SECTION_REF.finditer(text):
        spans.append(range(match.start(), match.end()))
        yield _target(match.group("file"), path), match.group("section")
    if path.suffix == ".md":
        for match in OWN_SECTION.finditer(text):
            if not any(match.start() in span for span in spans):
                yield path, match.group("section")


def test_every_section_a_pointer_names_is_a_heading_of_its_file() -> None:
    unresolved = [
        f'{path.relative_to(ROOT)}: {target.relative_to(ROOT) if target else "?"}, "{section}"'
        for path in _pointing_texts()
        for target, section in _section_references(path)
        if target is None or not _has_section(target, section)
    ]
    assert unresolved == []


def test_the_section_check_tells_a_stale_pointer_from_a_live_one() -> None:
    readme, operating = ROOT / "README.md", ROOT / "docs" / "operating.md"
    assert _has_section(readme, "Exit codes")
    assert _has_section(operating, "How recovery works")
    assert _has_section(ROOT / "BENCHMARKS.md", "Issue 61")
    assert not _has_section(readme, "Security")
    assert not _has_section(readme, "How recovery works")
    assert not _has_section(ROOT / "docs" / "fold-contract.md", "Report")


# --- modules ----------------------------------------------------------------------------------


def _package_roots() -> dict[str, Path]:
    """The first names a dotted module may start with, and the folder each names: `codeclog`,
    the layers linked into it (`omni`, `consumers`, ... as the docs write them) and `bench`."""
    linked = {
        p.name: p
        for p in sorted((ROOT / "codeclog").iterdir())
        if p.is_dir() and (p / "__init__.py").exists()
    }
    return {"codeclog": ROOT / "codeclog", "bench": ROOT / "bench", **linked}


@functools.cache
def _tree(module: Path) -> ast.Module:
    return ast.parse(module.read_text())


def _defined(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """The statement of `body` that binds `name` (a def, a class, an assignment, an import)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                return node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if name in names:
                return node
        elif isinstance(node, (ast.If, ast.Try)):
            inner = [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                inner.extend(handler.body)
            found = _defined(inner, name)
            if found is not None:
                return found
    return None


def _resolves(dotted: str) -> bool:
    """Whether `dotted` is a module of the checkout, or an attribute defined in one (a class's
    attribute in the class's body; past an imported name, the rest is not followed)."""
    first, *rest = dotted.split(".")
    folder: Path | None = _package_roots()[first]
    module = folder / "__init__.py"
    while rest and folder is not None:
        if (folder / rest[0] / "__init__.py").exists():
            folder = folder / rest[0]
            module = folder / "__init__.py"
        elif (folder / f"{rest[0]}.py").exists():
            module, folder = folder / f"{rest[0]}.py", None
        else:
            break
        rest = rest[1:]
    body: list[ast.stmt] = _tree(module).body
    for name in rest:
        node = _defined(body, name)
        if node is None:
            return False
        if not isinstance(node, ast.ClassDef):
            return True  # a function, a value or an import: what it holds is not followed
        body = node.body
    return True


@functools.cache
def _avro_names() -> frozenset[str]:
    """The full names of the records, enums and fixed types of schemas/avro/*.avsc."""
    names: set[str] = set()

    def walk(node: object, namespace: str) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, namespace)
        elif isinstance(node, dict):
            if node.get("type") in ("record", "enum", "fixed") and "name" in node:
                namespace = node.get("namespace", namespace)
                name = node["name"]
                names.add(name if "." in name else f"{namespace}.{name}")
            for value in node.values():
                walk(value, namespace)

    for schema in sorted((ROOT / "schemas" / "avro").glob("*.avsc")):
        walk(json.loads(schema.read_text()), "")
    return frozenset(names)


def _named_modules(path: Path) -> Iterator[str]:
    roots = _package_roots()
    for match in DOTTED.finditer(path.read_text()):
        dotted = match.group(1)
        if dotted.split(".")[0] in roots and dotted not in NOT_PYTHON.keys() | _avro_names():
            yield dotted


def test_every_module_named_in_the_prose_exists() -> None:
    unresolved = [
        f"{path.relative_to(ROOT)}: `{dotted}`"
        for path in _pointing_texts()
        for dotted in _named_modules(path)
        if not _resolves(dotted)
    ]
    assert unresolved == []


def test_the_module_check_tells_a_stale_name_from_a_live_one() -> None:
    assert _resolves("codeclog.errors.CodeclogError.EXIT_CODE")
    assert _resolves("schemas.wire")
    assert not _resolves("codeclog.no_such_room")
    assert not _resolves("codeclog.errors.NoSuchError")
    assert not _resolves("codeclog.errors.CodeclogError.no_such_attribute")
    assert "codeclog.ControlKind" in _avro_names()


# --- BENCHMARKS.md's opening table ------------------------------------------------------------

QUOTED = re.compile(r"\"([^\"]+)\"")
DATE = re.compile(r"^(?:-|\d{4}-\d{2}-\d{2}\b.*)$")


def test_benchmarks_md_opens_with_one_table_whose_rows_name_their_log_section() -> None:
    """Where things stand, before the log of how they got there: one table, each row a measure
    with its command and date, naming the Log section (a heading of the file) with its runs."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    opening, log_heading, _ = text.partition("\n## Log\n")
    assert log_heading, "BENCHMARKS.md has no '## Log' section"
    assert not re.search(r"^#{2,} ", opening, re.M), "nothing but the table comes before the Log"
    rows = [line for line in opening.splitlines() if line.startswith("|")]
    tables = re.findall(r"(?:^\|.*\n)+", opening, re.M)
    assert len(tables) == 1 and len(rows) > 2
    header, rule, *measures = (
        [cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows
    )
    assert header[:1] == ["measure (Log section)"] and {"command", "date"} <= set(header)
    assert set("".join(rule)) <= set("-:")
    command, date = header.index("command"), header.index("date")
    wrong = [
        row[0]
        for row in measures
        if len(row) != len(header)
        or not row[command]
        or not DATE.match(row[date])
        or not QUOTED.findall(row[0])
        or not all(_has_section(ROOT / "BENCHMARKS.md", s) for s in QUOTED.findall(row[0]))
    ]
    assert wrong == []
