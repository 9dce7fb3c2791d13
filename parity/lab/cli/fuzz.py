"""The hypothesis parity tests themselves, run for a time budget (parity/lab/fuzz.py).

    python -m parity fuzz [--seconds S] [--topic T] [--device cpu|cuda] [--seed N]

Every topic gets time within any budget of a few minutes: a first pass measures each
target's cost per example, then each topic gets an equal share of every round and slow
targets get fewer examples (parity/lab/fuzz.py says how). The summary lists every target with
the examples it ran; its last line reads
`fuzz: R/T targets ran, E examples in S s (seed N), F failing, complete|INCOMPLETE`.
Exit status: 0 every target ran and none failed; 1 a target failed; 4 the budget ran out
before every target ran (none of those that ran failed: give more --seconds).
"""

from __future__ import annotations

import argparse

from parity.lab.cli import UsageError, finite_float, int_at_least, require

HELP = "run the hypothesis parity tests for a time budget, every topic in turn"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from parity.claims import TOPICS

    p.add_argument("--seconds", type=finite_float(low=0, low_open=True), default=60.0,
                   help="time budget (default 60)")
    p.add_argument("--topic", choices=TOPICS, metavar="TOPIC",
                   help="only the topic's tests: parity/test_TOPIC.py and test_TOPIC_*.py "
                        f"({', '.join(TOPICS)})")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--seed", type=int_at_least(0), default=None,
                   help="order of the targets (default: random, printed in the summary)")


def run(args: argparse.Namespace) -> int:
    require("pytest", "hypothesis")  # the test extra: fuzz runs the tests' targets
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: torch.cuda.is_available() is False on this "
                             "machine; use --device cpu")
    from parity.lab.fuzz import fuzz

    return fuzz(seconds=args.seconds, topic=args.topic, device=args.device, seed=args.seed)
