"""The hypothesis parity tests themselves, run for a time budget (parity/fuzz.py).

    python -m parity fuzz [--seconds S] [--topic T] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse

from parity.cli import finite_float

HELP = "run the hypothesis parity tests for a time budget"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from parity.claims import TOPICS

    p.add_argument("--seconds", type=finite_float(low=0, low_open=True), default=60.0)
    p.add_argument("--topic", choices=TOPICS, help="only parity/test_TOPIC.py")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))


def run(args: argparse.Namespace) -> int:
    from parity.fuzz import fuzz

    return fuzz(seconds=args.seconds, topic=args.topic, device=args.device)
