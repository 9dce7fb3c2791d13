"""The generated parts of the docs are current, and the README's quick start is two lines."""

from __future__ import annotations

import re
from pathlib import Path

from parity.ranges import DOCS, formats_page_with_table, tolerances_markdown

ROOT = Path(__file__).resolve().parent.parent


def test_range_table_in_docs_is_what_the_code_prints() -> None:
    """docs/formats.md holds the current `python -m parity ranges` table."""
    page = (DOCS / "formats.md").read_text(encoding="utf-8")
    assert page == formats_page_with_table(page), "stale: run `python -m parity docs`"


def test_tolerances_page_is_generated_from_the_claim_table() -> None:
    """docs/tolerances.md equals the rendering of parity/tolerances.py."""
    page = (DOCS / "tolerances.md").read_text(encoding="utf-8")
    assert page == tolerances_markdown(), "stale: run `python -m parity docs`"


def test_readme_quick_start_is_exactly_two_command_lines() -> None:
    """The first fenced block under '## Quick start' holds an install line and a test line."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```[a-z]*\n(.*?)```", section, re.S)
    assert block is not None
    lines = [ln for ln in block.group(1).splitlines() if ln.strip()]
    assert len(lines) == 2 and lines[0].startswith("pip install") and "pytest" in lines[1]


def test_every_docs_link_to_a_repository_file_resolves() -> None:
    """Relative links in README.md and docs/*.md point at files that exist."""
    pages = [ROOT / "README.md", *DOCS.glob("*.md")]
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            if not (page.parent / target).exists():
                missing.append(f"{page.name}: {target}")
    assert not missing, missing
