"""The docs stay readable to the end: at most 12 pages and 120,000 characters in docs/, and every relative
link of README.md, docs/*.md and benchmarks/results/**/*.md leads to a file that exists and, when it
names a #anchor in a Markdown file, to a heading of that file (GitHub's slugs)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from test_readme import _LINK

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MAX_PAGES = 12
MAX_CHARS = 120_000
PAGES = [
    ROOT / "README.md",
    *sorted(DOCS.glob("*.md")),
    *sorted((ROOT / "benchmarks" / "results").rglob("*.md")),
]

_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The text as GitHub renders links in it: fenced code blocks and code spans left out."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link targets dropped, lowercase, punctuation other than '-' and '_'
    dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for _, heading in _HEADING.findall(_FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> list[tuple[str, str]]:
    """(path, anchor) of every link of a Markdown text that points into the repository: no URL; a bare
    anchor has path "" (the page itself); the anchor is "" when the link names none."""
    out = []
    for target in _LINK.findall(_prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # http:, https:, mailto: ...
        path, _, anchor = target.partition("#")
        out.append((unquote(path), unquote(anchor)))
    return out


def broken(page: Path, root: Path = ROOT) -> list[str]:
    """The links of `page` whose file does not exist under `root` (the repository), or whose #anchor names no
    heading of its Markdown file."""
    bad = []
    for path, anchor in links(page.read_text(encoding="utf-8")):
        target = (page.parent / path) if path else page
        if not target.exists() or not target.resolve().is_relative_to(root):
            bad.append(f"{path}#{anchor}" if anchor else path)
        elif anchor and target.is_file() and target.suffix == ".md" and anchor not in anchors(target):
            bad.append(f"{path}#{anchor} (no such heading)")
    return bad


def test_docs_are_at_most_12_pages_and_120000_characters():
    pages = sorted(DOCS.glob("*.md"))
    total = sum(len(p.read_text(encoding="utf-8")) for p in pages)
    assert len(pages) <= MAX_PAGES, f"docs/ has {len(pages)} pages (at most {MAX_PAGES}): fold some together"
    assert total <= MAX_CHARS, f"docs/ has {total} characters (at most {MAX_CHARS}): cut or move detail"


def test_slugs_follow_githubs_rules():
    assert slug("Ray resource pools (`--placement`)") == "ray-resource-pools---placement"
    assert slug("The paper's data") == "the-papers-data"
    assert slug("Metrics: avg@k and pass@k") == "metrics-avgk-and-passk"
    assert slug("Loss aggregation (`learner.loss_agg`)") == "loss-aggregation-learnerloss_agg"
    assert slug("3. Plan the run") == "3-plan-the-run"


def test_a_broken_link_or_anchor_is_reported(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (tmp_path / "outside.md").write_text("# Out\n")
    (repo / "there.md").write_text("# Title\n\n## A section (`x.y`)\n\n## A section (`x.y`)\n")
    page = repo / "page.md"
    page.write_text(
        "# Page\n[ok](there.md#a-section-xy) [dup](there.md#a-section-xy-1) [self](#page) [web](https://e.org/x)\n"
        "[gone](missing.md) [no heading](there.md#nope) [no self](#nope) [outside](../outside.md)\n"
        "```\n[in code](missing_in_code.md)\n```\n`[in span](missing_in_span.md)`\n"
    )
    expected = ["missing.md", "there.md#nope (no such heading)", "#nope (no such heading)", "../outside.md"]
    assert broken(page, root=repo) == expected


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    assert broken(page) == [], f"{page.relative_to(ROOT)} has links that lead nowhere"
