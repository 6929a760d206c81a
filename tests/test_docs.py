"""Every relative link of the README and docs/ resolves: the file exists, and an anchor names a
heading of it (GitHub's slugs), so a page moved or a heading renamed breaks here, not for a
reader."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in pages():
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):               # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no heading #{anchor})")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_no_page_points_at_the_teams_own_notes():
    """DESIGN.md / METHODS.md are not part of the project: its own docs say what the code does."""
    named = [f"{p.relative_to(ROOT)}" for p in pages() if re.search(r"\b(DESIGN|METHODS)\.md", p.read_text())]
    assert not named, named
