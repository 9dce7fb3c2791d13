"""The range table of every format: the reference's values derived from the bits, beside
torch.finfo's and ml_dtypes.finfo's; exit status 1 if any differ.

    python -m parity ranges
"""

from __future__ import annotations

import argparse

HELP = "range table of every format, reference / torch / ml_dtypes"


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from parity.lab.ranges import range_table

    text, differences = range_table()
    print(text)
    return 1 if differences else 0
