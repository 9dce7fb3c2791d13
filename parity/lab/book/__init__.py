"""The book: each topic's twin manifest (NOTE [ Twin manifests ] in parity/claims/__init__.py)
rendered as a static HTML page, after labml's annotated implementations but with two columns
of code: the reference object on the left, its torch twin (or the torch object it IS, or the
one line saying why there is none) on the right, aligned row by row, and under each row the
claims that tie it (id, kind, bound, the worst case observed and n as last recorded in
docs/data/report.json, its reason, links to the source of its tests on the same page).

    python -m parity book --out DIR [--topic T]        (parity/lab/cli/book.py)

The files: render.py (the site: the index, what is read from docs/), page.py (a topic's
page), markup.py (the frame, Pygments, anchors), source.py (what is shown of the code),
prose.py (docstrings and NOTE blocks as HTML), math.py (`$...$` as inline SVG by
matplotlib's mathtext), style.css.

Decisions:
- Generated from the code only. A page shows the manifest's rows; each side's source
  (`inspect.getsource`, or the binding statement for a constant or alias) with its docstring
  taken out and set beside it as prose; the twin modules' `# NOTE [ Name ]` blocks as prose
  before the first row defined after them; the claims from parity.tolerances; the recorded
  observations; the tests' source read from their files; docs/img/<topic>_*.png, captioned by
  the docstring of the function that draws each (parity/lab/pictures/).
- The introduction is the module docstring of the topic's reference module
  (reference/<topic>.py, else its first reference module, else its first module). A topic's
  one hand-written introduction, if it needs one, lives in ONE place: docs/book/<topic>.md,
  plain prose as a docstring is written (render.intro), shown above that docstring. None is
  written yet: every docstring already introduces its topic.
- Not committed. Every page is a pure function of the code and docs/data/, so a committed
  copy would double every change in review and go stale between runs. `python -m parity book
  --out DIR` builds it anywhere; build_docs() builds it into docs/_build/book (git-ignored),
  for `python -m parity docs` to build it beside the generated Markdown.
- Opens from disk: relative links only, one local style sheet, system fonts, no script, no
  CDN; formulas are SVG paths, and without matplotlib their TeX source in a <code>, said once
  at the top of the page (and once on stderr by the command).
Tests: tests/test_book.py (the pages, links, rows and claims, the command's refusals) and
tests/test_book_browser.py (headless Chromium: the two columns at 1440 px, stacked at 800 px).
"""

from __future__ import annotations

from pathlib import Path

from parity.lab.book.render import DOCS, Book, build

__all__ = ["BUILT", "Book", "build", "build_docs", "checkout_problem"]

BUILT = DOCS / "_build" / "book"  # git-ignored


def checkout_problem() -> str | None:
    """Why the book cannot be rendered here, or None: it reads a source checkout's docs/
    (the recorded observations, the pictures) and its tests/, which an installed copy lacks."""
    root = DOCS.parent
    if not (DOCS / "data").is_dir() or not (root / "pyproject.toml").is_file() or \
            not (root / "tests").is_dir():
        return (f"no source checkout around this parity package ({root}: no docs/data/, "
                "tests/ and pyproject.toml beside it); the book reads the checkout's recorded "
                "observations, pictures and tests: run it in a clone (pip install -e .)")
    return None


def build_docs(out: Path = BUILT) -> Book:
    """Build the whole book into docs/_build/book, replacing an earlier build there."""
    import shutil

    if out.is_dir():
        shutil.rmtree(out)
    return build(out)
