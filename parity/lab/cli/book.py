"""Render the book: each topic's twin manifest as an HTML page, the reference and its torch
counterpart side by side, row by row, each row with the claims that tie it (bound, the worst
case observed and n as last recorded in docs/data/report.json) and the source of their tests.

    python -m parity book --out DIR [--topic T]

DIR/index.html opens from disk: no server, no network, no script. --topic renders one topic's
page (and the index). The pages are generated from the code each time and not committed
(docs/book.md; parity/lab/book/).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from parity.claims import TOPICS

HELP = "render the book: each topic's twins side by side with their claims, as static HTML"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the folder to write the site into (new, empty, or an earlier book's)")
    p.add_argument("--topic", choices=TOPICS, metavar="T",
                   help="only this topic's page: " + ", ".join(TOPICS))


def run(args: argparse.Namespace) -> int:
    from parity.lab.cli import PROG, UsageError, output_folder

    if importlib.util.find_spec("pygments") is None:
        raise UsageError("Pygments is not installed: the book highlights code with it; "
                         'install the book extra: pip install -e ".[book]" in a checkout, '
                         'pip install "mirrortrain[book]" otherwise')
    from parity.lab.book import build, checkout_problem

    problem = checkout_problem()
    if problem is not None:
        raise UsageError(problem)
    out = output_folder(args.out, command=args.command)

    book = build(out, TOPICS if args.topic is None else (args.topic,))
    if book.tex_shown:
        print(f"{getattr(args, 'prog', PROG)} {args.command}: formulas shown as TeX source: "
              'matplotlib is not installed (pip install -e ".[plot]" in a checkout, '
              'pip install "mirrortrain[plot]" otherwise)', file=sys.stderr)
    pages = len(book.pages) - 1
    print(f"book: {pages} topic page{'s' * (pages != 1)}, open {out / 'index.html'}")
    return 0
