"""The hypothesis parity tests under pytest's fuzz profile, for a time budget (a front for
pytest: parity/lab/fuzz.py builds the command, parity/fuzz_plugin.py keeps the time).

    python -m parity fuzz [--seconds S] [--topic T] [--device cpu|cuda] [--seed N]

runs `python -m pytest <the topic's files, or parity/> --hypothesis-profile=fuzz
--fuzz-total S --hypothesis-seed N --device D` with the project's pytest settings (xdist over
every core, `--dist loadfile`). The budget: the tests that are not @given tests are
deselected (they are no fuzz targets), and S seconds of wall time, from the end of pytest's
collection, are shared equally among the @given tests as they start on the workers (NOTE [ A
fuzz run's time ] in parity/fuzz_plugin.py): each stops starting examples when its share is
spent, and always runs at least one, so a run ends about S seconds after pytest's start
(overrun by at most one example and its fixtures). A failure shows hypothesis' falsifying
example and its `@reproduce_failure` line in pytest's report. The summary lists every @given
test with the examples it ran; its last line reads `fuzz: R/T @given tests ran, E examples
in S s of tests (seed N), F failing, complete` (or `INCOMPLETE: ...`).
Exit status: 0 every @given test ran and none failed; 1 a test failed; 4 the budget ran out
before some test was reached (those are skipped: give more --seconds); 2 bad input, a topic
without @given tests included.
"""

from __future__ import annotations

import argparse

from parity.lab.cli import UsageError, finite_float, int_at_least, require

HELP = "run the hypothesis parity tests under pytest's fuzz profile for a time budget"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from parity.claims import TOPICS

    p.add_argument("--seconds", type=finite_float(low=0, low_open=True), default=60.0,
                   help="time budget, from the end of pytest's collection (default 60)")
    p.add_argument("--topic", choices=TOPICS, metavar="TOPIC",
                   help="only the topic's tests: parity/test_TOPIC.py and test_TOPIC_*.py "
                        f"({', '.join(TOPICS)})")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--seed", type=int_at_least(0), default=None,
                   help="hypothesis' seed, --hypothesis-seed (default: random, printed first)")


def run(args: argparse.Namespace) -> int:
    require("pytest", "hypothesis", "xdist")  # the test extra: fuzz runs the tests
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: torch.cuda.is_available() is False on this "
                             "machine; use --device cpu")
    from parity.lab.fuzz import fuzz

    return fuzz(seconds=args.seconds, topic=args.topic, device=args.device, seed=args.seed)
