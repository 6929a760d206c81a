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


RUN_OUTPUTS = {"report.md", "compare.md"}
"""Markdown files runs write (`runs/NAME/report.md`, `mmrlvr compare`'s table), not pages."""


def test_every_markdown_file_a_page_names_is_in_the_project():
    """A page that names a `.md` file (a link or not) names one the project holds: its docs
    describe its own design, not notes kept elsewhere."""
    held = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts and "runs" not in p.parts}
    named = [f"{p.relative_to(ROOT)}: {name}" for p in pages()
             for name in set(re.findall(r"\b([\w.-]+\.md)\b", p.read_text()))
             if name not in held | RUN_OUTPUTS]
    assert not named, "pages naming markdown files the project does not hold:\n" + "\n".join(named)
