"""The README stays a front door: short, and every link in it and in the docs leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_CHARS = 10_000

# [text](target) and ![alt](target); the target ends at the first space (a title may follow) or ")".
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def relative_links(text: str) -> list[str]:
    """The link targets of a Markdown text that point into the repository (no URL, no bare anchor)."""
    out = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
            continue  # http:, https:, mailto: ... and anchors within the same page
        out.append(target.split("#", 1)[0])
    return out


def broken_links(path: Path) -> list[str]:
    """The relative links of the Markdown file `path` whose file or folder does not exist."""
    return [t for t in relative_links(path.read_text(encoding="utf-8")) if not (path.parent / t).exists()]


def test_readme_is_at_most_10000_characters():
    n = len(README.read_text(encoding="utf-8"))
    assert n <= MAX_README_CHARS, f"README.md has {n} characters (at most {MAX_README_CHARS}): move detail to docs/"


def test_link_parser_finds_relative_links_and_skips_urls_and_anchors():
    text = "[a](docs/x.md) ![img](b/c.png) [u](https://e.org/y) [s](#top) [t](docs/z.md#part) [m](mailto:a@b)"
    assert relative_links(text) == ["docs/x.md", "b/c.png", "docs/z.md"]


def test_a_missing_target_is_reported(tmp_path):
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [gone](missing/file.md) [web](https://example.org/missing)")
    assert broken_links(page) == ["missing/file.md"]


@pytest.mark.parametrize(
    "page",
    [README, *sorted((ROOT / "docs").glob("*.md"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_relative_link_points_to_an_existing_file(page):
    assert relative_links(page.read_text(encoding="utf-8")) or page != README, "README.md links nothing"
    assert broken_links(page) == [], f"{page.relative_to(ROOT)} links to files that do not exist"


def test_the_readme_commands_are_makefile_targets():
    readme = README.read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("train", "test"):
        assert f"make {target}" in readme
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), f"the README runs `make {target}`: no such target"


def test_the_readme_opens_with_a_quick_start_holding_both_commands():
    readme = README.read_text(encoding="utf-8")
    sections = re.findall(r"^## (.+)$", readme, re.MULTILINE)
    assert sections[0] == "Quick start", sections
    start = readme.index("## Quick start")
    quick = readme[start : readme.index("\n## ", start + 1)]
    assert "make train" in quick and "make test" in quick
    assert ".ci/run" not in quick  # what a user runs, not CI
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")  # CI runs the README's test command
