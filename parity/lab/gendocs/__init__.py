"""Every generated part of docs/: one registry, one command, one staleness test.

A generated part is either a whole page or a section of a hand-written page between two
markers:

    <!-- generated: NAME (python -m parity docs) -->
    ...rendered text...
    <!-- end generated: NAME -->

Each topic registers its parts in `parity/lab/gendocs/<topic>.py`:

    @section("formats.md", "range-table")
    def _() -> str: ...            # the text between the markers

    @page("tolerances.md")
    def _() -> str: ...            # the whole page

A page name is relative to docs/: "../README.md" is the README (its command reference and
exit statuses: parity/lab/gendocs/readme.py).

Renderers are deterministic: they read the code, the claim table and committed measurement
files (docs/data/*.json, written by benchmarks/), never a clock or a fresh timing. So
`python -m parity docs` rewrites every part, and tests/test_docs.py fails when any committed
part differs from what the code renders now. Pictures are the other generated output of
docs/ (parity/lab/pictures/).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout holding parity/
DOCS = ROOT / "docs"


def checkout_problem(docs: Path | None = None) -> str | None:
    """Why `docs/` (default DOCS) cannot be regenerated here, or None: it needs the source
    checkout (docs/ and pyproject.toml beside the parity package), which a wheel install does
    not have."""
    docs = DOCS if docs is None else docs
    if not docs.is_dir() or not (docs.parent / "pyproject.toml").is_file():
        return (f"no source checkout around this parity package ({docs.parent}: no docs/ "
                "folder and pyproject.toml beside it); this is an installed copy, and `docs` "
                "rewrites the docs/ of a checkout: run it in a clone (pip install -e .)")
    return None


@dataclass(frozen=True)
class Part:
    page: str  # file name under docs/
    name: str | None  # the section's marker name; None for a whole generated page
    render: Callable[[], str]

    @property
    def label(self) -> str:
        return self.page if self.name is None else f"{self.page}#{self.name}"


PARTS: dict[str, Part] = {}


def _register(part: Part) -> None:
    if part.label in PARTS:
        raise RuntimeError(f"two generators for docs/{part.label}")
    PARTS[part.label] = part


def section(page_name: str, name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    """Register the renderer of the section `name` of docs/<page_name>."""

    def register(fn: Callable[[], str]) -> Callable[[], str]:
        _register(Part(page_name, name, fn))
        return fn

    return register


def page(page_name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    """Register the renderer of the whole page docs/<page_name>."""

    def register(fn: Callable[[], str]) -> Callable[[], str]:
        _register(Part(page_name, None, fn))
        return fn

    return register


def markers(name: str) -> tuple[str, str]:
    return (f"<!-- generated: {name} (python -m parity docs) -->",
            f"<!-- end generated: {name} -->")


def load() -> dict[str, Part]:
    """Import every module of parity.lab.gendocs so that their registrations run."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"parity.lab.gendocs.{info.name}")
    return PARTS


def with_section(text: str, name: str, body: str, where: str = "") -> str:
    """`text` with the section `name` replaced by `body`; ValueError if its markers are
    missing or out of order."""
    begin, end = markers(name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"{where or 'page'}: needs exactly one pair of markers\n  {begin}\n"
                         f"  {end}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body.strip()}\n{end}{tail}"


def rendered(docs: Path = DOCS) -> dict[Path, str]:
    """Every generated page as the code renders it now: {path: full text}."""
    pages: dict[Path, str] = {}
    for part in sorted(load().values(), key=lambda p: p.label):
        path = docs / part.page
        if part.name is None:
            pages[path] = part.render().rstrip("\n") + "\n"
            continue
        text = pages.get(path)
        if text is None:
            text = path.read_text(encoding="utf-8")
        pages[path] = with_section(text, part.name, part.render(), f"docs/{part.page}")
    return pages


def stale(docs: Path = DOCS) -> list[str]:
    """docs/ pages whose committed text differs from what the code renders now."""
    return [os.path.relpath(path, docs) for path, text in rendered(docs).items()
            if not path.exists() or path.read_text(encoding="utf-8") != text]


def update(docs: Path = DOCS) -> list[Path]:
    """Rewrite every generated part of docs/; return the pages that changed."""
    changed = []
    for path, text in rendered(docs).items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed
