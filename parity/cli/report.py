"""Every claim's quick check, as one table: claim, tolerance, observed worst case, verdict.

    python -m parity report [--topic T] [--out DIR]

The exit status is 1 when any claim fails, errors or has no check (the table never claims
more than it checks). Pictures go to --out (default report/; '' for none).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from parity.claims import TOPICS

HELP = "check every claim quickly and print the table"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", choices=TOPICS, help="only this topic's claims")
    p.add_argument("--out", default="report", help="folder for pictures ('' for none)")


def run(args: argparse.Namespace) -> int:
    from parity import report

    rows = report.run(args.topic)
    print(report.render(rows))
    pictures = report.write_pictures(Path(args.out)) if args.out else []
    if pictures:
        print(f"\npictures: {', '.join(str(p) for p in pictures)}")
    elif args.out:
        print("\npictures: none written (install the 'plot' extra for matplotlib)")
    failed = [r for r in rows if r.verdict != "ok"]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} claims hold")
    return 1 if failed or not rows else 0
