"""Regenerate every generated part of docs/ (parity/gendocs), redraw its pictures
(parity/pictures) from the code and the committed measurements in docs/data/, and build the
book into docs/_build/book (parity/lab/book: not committed; it needs Pygments, the book extra).

    python -m parity docs [--no-pictures]

Works in a source checkout (it writes into the checkout's docs/; an installed wheel has none
and is refused with a one-line reason); tests/test_docs.py fails when any generated part is
stale.
"""

from __future__ import annotations

import argparse
import sys

from parity.lab.cli import UsageError, pictures_skipped

HELP = "regenerate every generated part of docs/ and its pictures"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-pictures", action="store_true", help="only the text parts")


def run(args: argparse.Namespace) -> int:
    from parity.lab import gendocs, pictures

    problem = gendocs.checkout_problem()
    if problem is not None:
        raise UsageError(problem)
    changed = gendocs.update()
    for path in changed:
        print(f"wrote {path}")
    print(f"{len(gendocs.PARTS)} generated parts, {len(changed)} pages changed")
    if not args.no_pictures:
        drawn = pictures.draw_all()
        if drawn:
            print(f"drew {len(drawn)} pictures into {pictures.IMG}")
        else:
            pictures_skipped(args)
    import importlib.util

    if importlib.util.find_spec("pygments") is None:
        print("the book was not built: it needs Pygments (pip install -e \".[book]\")",
              file=sys.stderr)
        return 0
    from parity.lab import book

    site = book.build_docs()
    print(f"built the book into {book.BUILT} ({len(site.pages) - 1} topic pages)")
    return 0
