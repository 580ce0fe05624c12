"""Links between the README and the docs lead somewhere: every relative link names a
file that exists and, with ``#anchor``, a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_CODE_BLOCK = re.compile(r"```.*?```", re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _CODE_BLOCK.sub("", page.read_text())
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def _links(page: Path) -> list[str]:
    text = _CODE_BLOCK.sub("", page.read_text())
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_slugs_follow_githubs_rule() -> None:
    assert _slug("Step 20 (the README until step 21)") == (
        "step-20-the-readme-until-step-21")
    assert _slug("Spark's watermark and late rows") == "sparks-watermark-and-late-rows"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_a_file_and_heading(page: Path) -> None:
    assert _links(page) or page.name != "README.md", "the README links to its docs"
    for link in _links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.is_file(), f"{page.name}: {link} names no file"
        if anchor:
            assert anchor in _anchors(target), f"{page.name}: {link} names no heading"
