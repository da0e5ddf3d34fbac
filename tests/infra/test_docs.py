"""The docs a user reads are a guide and stay true: the README is guide-sized and holds no run
logs outside its generated blocks, every generated part (references, README tables, the
answer, the timings) is what the code and the records render, and every link resolves."""

import re
from pathlib import Path

import pytest

from infra import docs

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md")
                                      if p.name != "benchmarks.md")  # benchmarks: generated
# what a run log looks like: a commit hash, a date, a measured duration, words about the work
LOG_PATTERNS = {
    "commit hash": r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])",
    "date": r"\b20\d\d-\d\d-\d\d\b|\b\d{1,2} (January|February|March|April|May|June|July|"
            r"August|September|October|November|December) 20\d\d\b",
    "run timing": r"\b\d+ ?min \d+ ?s\b|\b\d+m\d+(\.\d+)?s\b|\btook \d|\b\d+(\.\d+)? ?s wall\b",
    "how the work was done": r"\b[Ss]ession \d+|\bthis (tree|session)\b|\bmeasured at\b",
}


def _outside_blocks(text: str) -> str:
    return docs.BLOCK.sub("", text)


def test_readme_is_a_guide_of_at_most_300_lines_and_25_kb():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300, len(text.splitlines())
    assert len(text.encode()) <= 25_000, len(text.encode())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_docs_hold_no_run_log_outside_generated_blocks(page):
    whole = page.read_text()
    text = _outside_blocks(whole)
    found = {kind: sorted({m.group(0) for m in re.finditer(pattern, text)})
             for kind, pattern in LOG_PATTERNS.items()}
    # a commit hash is a run log's even in a generated block: records hold it, not the guide
    found["commit hash"] = sorted(set(re.findall(LOG_PATTERNS["commit hash"], whole)))
    assert not {k: v for k, v in found.items() if v}, f"{page.name}: {found}"


def test_the_log_patterns_catch_what_they_name():
    """The patterns above are not vacuous: each finds its kind in a line of the old README."""
    old = ("took **20 min 60 s** at `89c3364` (2026-12-07, 12:45 p.m., session 46's tree)")
    assert all(re.search(p, old) for p in LOG_PATTERNS.values())
    assert not re.search(LOG_PATTERNS["commit hash"], "ddp-100g, cuda, 0.05, deadbeef-free")


def test_every_generated_doc_is_what_the_code_and_records_render():
    assert docs._stale() == []  # else: `make docs`, and commit what it wrote


def test_a_stale_readme_block_is_found(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    assert "<!-- generated: dampers -->" in text
    readme.write_text(text.replace("| `geodamp` |", "| `geodamp (edited by hand)` |"))
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    monkeypatch.setattr(docs, "generated_files", lambda: {})
    assert docs._stale() == ["README.md (a generated block)"]


@pytest.mark.parametrize("page", PAGES + [ROOT / "CONTRIBUTING.md"], ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        missing_anchor = bool(anchor) and file.suffix == ".md" and file.exists() and (
            anchor not in _anchors(file.read_text()))
        if not file.exists() or missing_anchor:
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out
