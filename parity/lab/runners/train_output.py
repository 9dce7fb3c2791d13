"""What `python -m parity train` prints beside its step lines (parity/lab/cli/train.py): the
warning of a run's length, the numerics counts' table, and the first invalid value's
report, replay file and `first-invalid:` line."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class RunLength:
    """Says once, on stderr, how long a run will take when that is longer than WARN_S: after
    AFTER_S of steps, their rate times the steps to go (`--steps 10**12` is accepted, as
    any count within the horizon is, but not silently: about 6 years at 0.2 ms a step)."""

    AFTER_S, WARN_S = 2.0, 3600.0

    def __init__(self, steps: int, notify: Callable[[str], None]) -> None:
        self.steps, self.notify = steps, notify
        self.first: tuple[int, float] | None = None
        self.said = False

    def step(self, line: str) -> None:
        if self.said or not line.startswith("step "):
            return
        now, at = time.perf_counter(), int(line.split()[1])
        if self.first is None:
            self.first = (at, now)
            return
        began, done = self.first[1], at - self.first[0]
        if now - began < self.AFTER_S or done <= 0:
            return
        self.said = True
        each = (now - began) / done
        left = (self.steps - at) * each
        if left > self.WARN_S:
            self.notify(f"train: {self.steps - at:,} steps to go at {each * 1e3:.3g} ms a step: "
                        f"about {duration(left)}; Ctrl-C stops it in one line, keeping the "
                        "checkpoints written so far")


def duration(seconds: float) -> str:
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds / 60:.0f} minutes"


def counts_table(history: list[dict[str, list[int]]], title: str) -> str:
    """The counts summed over `history`'s steps, one line per activation and gradient, the
    name column as wide as the longest name."""
    from common.numerics_report import COLUMNS

    names = list(dict.fromkeys(name for counts in history for name in counts))
    width = max([len(title), *map(len, names)]) + 2
    lines = [f"{title:<{width}}" + "".join(f"{c:>10}" for c in COLUMNS)]
    for name in names:
        total = [sum(column) for column in
                 zip(*(c[name] for c in history if name in c), strict=True)]
        lines.append(f"{name:<{width}}" + "".join(f"{v:>10}" for v in total))
    return "\n".join(lines)


def steps_title(history: list[Any], last: int) -> str:
    """'counts over 3 steps (4 to 6)': the steps this process ran, which a resume shortens."""
    n = len(history)
    if n == 1:
        return f"counts of step {last}"
    return f"counts over {n} steps ({last - n + 1} to {last})"


def found(args: argparse.Namespace, e: Any) -> int:
    """The first invalid value: the report, the replay file, the `first-invalid:` line."""
    from parity.lab.cli import EXIT_FOUND
    from parity.lab.runners.replay_file import write_replay

    # (the directory is gone again if no checkpoint was written: write_replay makes it)
    path = write_replay(args.impl, Path(args.checkpoint_dir), e.report.step, e.replay,
                        lambda line: print(line, file=sys.stderr, flush=True))
    if not args.quiet:
        print(e.report.describe())
        print(counts_table([e.report.counts], f"counts of step {e.report.step}"))
        print(f"replay: {args.prog} replay {path} --impl {args.impl}")
    print(e.report.line(), flush=True)
    return EXIT_FOUND
