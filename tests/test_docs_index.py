"""docs/index.md is the entry point: it links every page of docs/, and every link resolves."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_index_links_every_page() -> None:
    index = (DOCS / "index.md").read_text()
    linked = set(re.findall(r"\]\(([^)#]+\.md)", index))
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    assert pages - linked == set(), "pages missing from docs/index.md"
    for target in linked:
        assert (DOCS / target).resolve().is_file(), f"docs/index.md links {target}: missing"
