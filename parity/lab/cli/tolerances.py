"""The claim table as Markdown (the text of docs/tolerances.md).

    python -m parity tolerances
"""

from __future__ import annotations

import argparse

HELP = "the claim table as Markdown"


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from parity.lab.gendocs.claims import tolerances_markdown

    print(tolerances_markdown())
    return 0
