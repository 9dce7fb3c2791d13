"""The generated parts of the docs are current, and the README's quick start is two lines."""

from __future__ import annotations

import re
from pathlib import Path

from parity.lab import gendocs, pictures

ROOT = Path(__file__).resolve().parent.parent


def test_every_generated_part_of_docs_is_current() -> None:
    """Every page or section registered in parity/gendocs equals what the code renders now."""
    assert gendocs.load(), "no generated parts registered"
    assert gendocs.stale() == [], "stale: run `python -m parity docs`"


def test_every_picture_in_docs_is_drawn_by_the_code() -> None:
    """docs/img holds exactly the pictures parity/pictures registers (none orphaned, none
    missing), so `python -m parity docs` redraws every one of them."""
    registered = set(pictures.load())
    present = {p.name for p in pictures.IMG.glob("*.png")}
    assert registered == present, (f"drawn but not in docs/img: {sorted(registered - present)}; "
                                   f"in docs/img but drawn by nothing: "
                                   f"{sorted(present - registered)}")


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
    pages = [ROOT / "README.md", *gendocs.DOCS.glob("*.md")]
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            if not (page.parent / target).exists():
                missing.append(f"{page.name}: {target}")
    assert not missing, missing


def test_the_readme_topic_table_links_every_twin_module_and_every_parity_test_file() -> None:
    """The README's table of topics (one topic, one stem, every tree) is the index a reader
    starts from: each twin module of every topic's manifest, and each parity/test_*.py, is
    linked in it."""
    import importlib

    from parity.claims import TOPICS

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = "\n".join(ln for ln in text.splitlines() if ln.startswith("| "))
    modules = [m for t in TOPICS
               for m in importlib.import_module(f"parity.claims.{t}").MANIFEST.modules]
    tests = [f"parity/{p.name}" for p in sorted((ROOT / "parity").glob("test_*.py"))]
    paths = [m.replace(".", "/") + ".py" for m in modules] + tests
    assert [p for p in paths if f"]({p})" not in table] == []
