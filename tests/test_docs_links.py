"""Every link in the docs points somewhere: relative Markdown links and `docs/...` paths in README.md,
docs/*.md and docs/notes/*.md name files that exist (and headings that exist, where a link names one),
and the `docs/....md` pages the code's comments and strings cite exist. No database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "notes").glob("*.md")])
CODE_DIRS = ("apps", "whalegen", "agents", "benchmarks", "docker", "scripts", "tests", "frontend", ".ci")
CODE_FILES = ("pyproject.toml", "manage.py")
SUFFIXES = {".py", ".yml", ".yaml", ".toml", ".sh", ".html", ".conf", ".cfg", ".txt"}

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)|!\[[^\]\n]*\]\(([^)\s]+)\)")
DOCS_PATH = re.compile(r"(?<![\w/.$-])docs/[\w./*-]*[\w*/]")
CODE_PAGE = re.compile(r"(?<![\w/.-])docs/[\w/-]+\.md\b")


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped but hyphens, spaces to hyphens; repeats
    numbered -1, -2, …; headings inside fenced code are not headings."""
    found: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        heading = re.match(r"#{1,6} +(.*?) *#* *$", line)
        if fenced or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def _exists(target: str) -> bool:
    if "*" in target:
        return any(ROOT.glob(target))
    return (ROOT / target).exists()


def broken_links(page: Path) -> list[str]:
    text = page.read_text()
    broken = []
    for match in LINK.finditer(text):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{_relative(page)}: {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            broken.append(f"{_relative(page)}: {target} (no such heading)")
    for match in DOCS_PATH.finditer(text):
        target = match.group(0).rstrip(".")
        if not _exists(target):
            broken.append(f"{_relative(page)}: {target} (no such path)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_every_link_and_docs_path_on_the_page_exists(page: Path) -> None:
    assert broken_links(page) == []


def test_the_notes_are_there_and_every_note_is_linked_from_the_index() -> None:
    notes = sorted(p.name for p in (ROOT / "docs" / "notes").glob("*.md") if p.name != "README.md")
    assert notes, "docs/notes/ holds the engineering notes"
    index = (ROOT / "docs" / "notes" / "README.md").read_text()
    assert [name for name in notes if f"({name})" not in index] == []


def test_every_docs_page_the_code_cites_exists() -> None:
    sources = [ROOT / name for name in CODE_FILES if (ROOT / name).is_file()]
    for folder in CODE_DIRS:
        for source in sorted((ROOT / folder).rglob("*")):
            # Scripts without a suffix (scripts/test, .ci/run) are read too.
            if source.is_file() and (source.suffix in SUFFIXES or source.suffix == ""):
                sources.append(source)
    missing = [
        f"{_relative(source)}: {match.group(0)}"
        for source in sources
        for match in CODE_PAGE.finditer(source.read_text(errors="replace"))
        if not (ROOT / match.group(0)).is_file()
    ]
    assert missing == []
