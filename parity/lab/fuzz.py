"""`python -m parity fuzz`: the hypothesis parity tests themselves, for a time budget.

Every `@given` test in parity/test_*.py is a fuzz target of its claim topic (a topic's tests
may span parity/test_<topic>.py and parity/test_<topic>_<part>.py), once per combination of
its `pytest.mark.parametrize` values, called directly with its module's argument-free
autouse fixtures applied (parity/fuzz_targets.py finds and drives them).
Tests that need other fixtures, and state machines, are left to
`pytest parity/ --hypothesis-profile=fuzz`, and the summary names them.

Scheduling, so that every topic gets time within any budget of a few minutes:
1. Order: targets interleaved topic by topic (formats, nn, optim, ... then the second target
   of each topic), topics and targets shuffled by `--seed`, so a budget cut short still
   touched every topic, and a different seed starts elsewhere.
2. First pass: FIRST_PASS examples per target, timed, which measures each target's cost per
   example (a training run and a float cast differ by orders of magnitude).
3. Rounds of ROUND_SECONDS (or what is left): each topic gets an equal share of the round,
   each target an equal slice of its topic's; a call starts no new example once its slice
   is spent (at least one example, at most MAX_PER_CALL), so slow targets get fewer
   examples and the budget is overrun by at most one example. Near the end a target whose
   measured cost per example exceeds what is left is skipped; the order rotates by one
   target every round.
The budget counts from the first example (importing the tests takes a few seconds more).
A target that fails is not run again; its traceback (with hypothesis' falsifying example)
is printed. The summary lists every target with the examples it ran, and the last line
says whether every target ran ("complete") or which did not.
"""

from __future__ import annotations

import collections
import itertools
import random
import sys
import time
from collections.abc import Callable

from parity.fuzz_targets import Target, TargetFailed, discover

FIRST_PASS = 2  # examples per target in the pass that measures costs
ROUND_SECONDS = 60.0  # length of one scheduling round after the first pass
MAX_PER_CALL = 10_000  # examples per target per call (the time slice usually ends it)


# -- scheduling ------------------------------------------------------------------------------

def interleaved(targets: list[Target], rng: random.Random) -> list[Target]:
    """Targets topic by topic in turn (topics and targets within each shuffled by rng)."""
    by_topic: dict[str, list[Target]] = {}
    for t in targets:
        by_topic.setdefault(t.topic, []).append(t)
    topics = sorted(by_topic)
    rng.shuffle(topics)
    for t_list in by_topic.values():
        rng.shuffle(t_list)
    columns = [by_topic[t] for t in topics]
    return [t for row in itertools.zip_longest(*columns) for t in row if t is not None]


def schedule(targets: list[Target], seconds: float, seed: int,
             clock: Callable[[], float] = time.monotonic,
             progress: Callable[[Target], None] = lambda t: None) -> float:
    """Run the targets for `seconds` (module docstring: first pass, then rounds); fill in
    each Target's examples, seconds, calls and failure; return the seconds spent. A call
    starts no example after its slice, so the budget is overrun by at most one example."""
    order = interleaved(targets, random.Random(seed))
    start = clock()
    deadline = start + seconds

    def run(t: Target, n: int, slice_seconds: float | None) -> None:
        began = clock()
        try:
            ran = t.call(n, slice_seconds)
        except TargetFailed as e:
            ran, t.failure = e.examples, e.text
        t.examples += ran
        t.seconds += clock() - began
        t.calls += 1
        progress(t)

    for t in order:  # first pass: FIRST_PASS examples each, which measures every cost
        if clock() >= deadline:
            break
        run(t, FIRST_PASS, None)
    rounds = 0
    while clock() < deadline:
        live = [t for t in order if t.failure is None]
        per_topic = collections.Counter(t.topic for t in live)
        if not live:
            break
        share = min(ROUND_SECONDS, deadline - clock()) / len(per_topic)
        k = rounds % len(order)
        rounds += 1
        ran_any = False
        for t in order[k:] + order[:k]:
            left = deadline - clock()
            if t.failure is not None or left <= 0:
                continue
            if t.calls == 0:  # the first pass never reached it
                run(t, FIRST_PASS, None)
            elif left >= t.cost:  # at least one example fits in what is left
                run(t, MAX_PER_CALL, min(share / per_topic[t.topic], left))
            else:
                continue
            ran_any = True
        if not ran_any:
            break  # what is left is too short for any target
    return clock() - start


# -- the command -----------------------------------------------------------------------------

def summary(targets: list[Target], left_out: list[str], seconds: float, budget: float,
            seed: int) -> tuple[str, bool]:
    """(the report text, whether every target ran at least one example)."""
    width = max([len(t.label) for t in targets] + [6])
    lines = [f"{'target'.ljust(width)}  {'examples':>8}  {'seconds':>7}  result",
             f"{'-' * width}  {'-' * 8}  {'-' * 7}  ------"]
    for t in sorted(targets, key=lambda t: t.label):
        result = "FAILED" if t.failure else ("ok" if t.examples else "NOT RUN")
        lines.append(f"{t.label.ljust(width)}  {t.examples:>8,}  {t.seconds:>7.1f}  {result}")
    topics: dict[str, list[Target]] = {}
    for t in targets:
        topics.setdefault(t.topic, []).append(t)
    lines.append("")
    for topic, ts in sorted(topics.items()):
        ran = [t for t in ts if t.examples]
        lines.append(f"{topic}: {len(ran)}/{len(ts)} targets, "
                     f"{sum(t.examples for t in ts):,} examples, "
                     f"{sum(t.seconds for t in ts):.1f} s")
    if left_out:
        lines += ["", "left to `pytest parity/ --hypothesis-profile=fuzz`:",
                  *(f"  {x}" for x in left_out)]
    for t in targets:
        if t.failure:
            lines += ["", f"--- FAILED {t.label}", t.failure.rstrip()]
    ran = [t for t in targets if t.examples]
    failing = [t for t in targets if t.failure]
    complete = len(ran) == len(targets)
    not_run = [t.label for t in targets if not t.examples]
    lines.append("")
    if not complete:
        lines.append(f"the budget of {budget:g} s ran out before {len(not_run)} targets ran "
                     f"(not run: {', '.join(not_run)}); give more --seconds")
    lines.append(f"fuzz: {len(ran)}/{len(targets)} targets ran, "
                 f"{sum(t.examples for t in targets):,} examples in {seconds:.1f} s "
                 f"(seed {seed}), {len(failing)} failing, "
                 f"{'complete' if complete else 'INCOMPLETE'}")
    return "\n".join(lines), complete


def run_targets(found: list[Target], left_out: list[str], seconds: float, seed: int,
                clock: Callable[[], float] = time.monotonic) -> tuple[str, int]:
    """Schedule `found` for `seconds` with a progress bar on stderr; return (the summary,
    the exit status: 0 every target ran and none failed, 1 one failed, 4 some never ran)."""
    from tqdm import tqdm

    from parity.lab.cli import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK

    with tqdm(total=max(1, round(seconds)), unit="s", file=sys.stderr, leave=False,
              bar_format="{percentage:3.0f}%|{bar}| {n:.0f}/{total} s {postfix}") as bar:
        began = clock()

        def progress(t: Target) -> None:
            bar.n = min(round(clock() - began), bar.total)
            bar.set_postfix_str(f"{t.label} ({t.examples:,})", refresh=True)

        spent = schedule(found, seconds, seed, clock=clock, progress=progress)
    text, complete = summary(found, left_out, spent, seconds, seed)
    if any(t.failure for t in found):
        return text, EXIT_FAILED
    return text, EXIT_OK if complete else EXIT_INCOMPLETE


def fuzz(seconds: float, topic: str | None = None, device: str = "cpu",
         seed: int | None = None) -> int:
    """Fuzz for `seconds`; print the summary; return the exit status (parity/lab/cli/fuzz.py)."""
    from parity import setting
    from parity.lab.cli import EXIT_FAILED

    print(setting.pin_torch(), flush=True)
    seed = random.randrange(2**32) if seed is None else seed
    found, left_out = discover(topic, device)
    if not found:
        print(f"no fuzz targets found{f' for topic {topic}' if topic else ''}", file=sys.stderr)
        return EXIT_FAILED
    text, status = run_targets(found, left_out, seconds, seed)
    print(text)
    return status
