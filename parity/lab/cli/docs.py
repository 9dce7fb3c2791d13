"""Regenerate every generated part of docs/ (parity/gendocs) and redraw its pictures
(parity/pictures) from the code and the committed measurements in docs/data/.

    python -m parity docs [--no-pictures]

Works in a source checkout (it writes into the checkout's docs/; an installed wheel has none
and is refused with a one-line reason); tests/test_docs.py fails when any generated part is
stale.
"""

from __future__ import annotations

import argparse

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
    if args.no_pictures:
        return 0
    drawn = pictures.draw_all()
    if drawn:
        print(f"drew {len(drawn)} pictures into {pictures.IMG}")
    else:
        pictures_skipped(args)
    return 0
