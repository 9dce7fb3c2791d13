"""`python -m parity fuzz`: the hypothesis parity tests themselves, for a time budget.

Every `@given` test in parity/test_*.py is a fuzz target of its claim topic (a topic's tests
may span parity/test_<topic>.py and parity/test_<topic>_<part>.py: `topic_of`). It is called
directly (hypothesis tests accept their non-generated arguments as keywords), once per
combination of its `pytest.mark.parametrize` values, with its module's argument-free
autouse fixtures applied.
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
import contextlib
import functools
import importlib
import inspect
import itertools
import random
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

FIRST_PASS = 2  # examples per target in the pass that measures costs
ROUND_SECONDS = 60.0  # length of one scheduling round after the first pass
MAX_PER_CALL = 10_000  # examples per target per call (the time slice usually ends it)


@dataclass
class Target:
    """One fuzz target: `call(n, seconds)` runs up to n fresh examples, starting none after
    `seconds` (None: no limit), and returns how many ran, or raises TargetFailed."""

    label: str
    topic: str
    call: Callable[[int, float | None], int]
    examples: int = 0
    seconds: float = 0.0
    calls: int = 0
    failure: str | None = None

    @property
    def cost(self) -> float:
        """Seconds per example so far (the whole call, hypothesis' own work included)."""
        return self.seconds / max(self.examples, 1)


class TargetFailed(Exception):
    """A target's test failed after running `examples` examples; `text` is its traceback."""

    def __init__(self, examples: int, text: str) -> None:
        super().__init__(text)
        self.examples, self.text = examples, text


# -- discovery -------------------------------------------------------------------------------

def _parametrizations(fn: Callable) -> list[dict]:
    grids = []
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names, values = mark.args[0], mark.args[1]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        rows = [v if len(names) > 1 else (v,) for v in values]
        grids.append([dict(zip(names, row, strict=True)) for row in rows])
    combos = []
    for parts in itertools.product(*grids):
        merged: dict = {}
        for p in parts:
            merged.update(p)
        combos.append(merged)
    return combos or [{}]


def _autouse_fixtures(module: object) -> list[Callable[[], object]] | None:
    """The module's autouse fixtures as plain argument-free functions; None if one cannot be
    applied outside pytest (it takes arguments, or this pytest hides the function)."""
    found: list[Callable[[], object]] = []
    for obj in vars(module).values():
        marker = getattr(obj, "_fixture_function_marker", None) or getattr(
            obj, "_pytestfixturefunction", None)
        if marker is None or not getattr(marker, "autouse", False):
            continue
        get = getattr(obj, "_get_wrapped_function", None)
        fn = get() if get is not None else getattr(obj, "__wrapped__", None)
        if fn is None or inspect.signature(fn).parameters:
            return None
        found.append(fn)
    return found


@contextlib.contextmanager
def _applied(fixtures: list[Callable[[], object]]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for fx in fixtures:
            made = fx()
            if inspect.isgenerator(made):
                next(made)
                stack.callback(lambda g=made: next(g, None))
        yield


class TimeUp(KeyboardInterrupt):
    """Raised inside a hypothesis run to end it when its time slice is spent. hypothesis lets
    a KeyboardInterrupt through at once: it does not take it for a test failure, neither
    shrinks nor replays it, and records nothing about the example (any other exception at
    that point makes it report flaky data generation). Only raised while no example has
    failed, so a failure found late is still shrunk to the end."""


@dataclass
class Slice:
    """What `time_slice` saw: examples started, whether one failed, whether time ran out."""

    count: int = 0
    failed: bool = False
    stopped: bool = False


@contextlib.contextmanager
def time_slice(fn: Callable, seconds: float | None) -> Iterator[Slice]:
    """While active, the hypothesis test `fn` counts its examples and starts none after
    `seconds` (None: no limit) unless one has failed: it raises TimeUp instead, which the
    caller treats as a normal end (`call` below; conftest.py's fuzz profile). hypothesis' own
    control flow (StopTest, a BaseException, when a draw runs out of data;
    UnsatisfiedAssumption) passes through the test and is not a failure."""
    from hypothesis.errors import UnsatisfiedAssumption

    inner = fn.hypothesis.inner_test  # type: ignore[attr-defined]
    stop_at = None if seconds is None else time.monotonic() + seconds
    state = Slice()

    @functools.wraps(inner)
    def counted(*args: object, **kw: object) -> object:
        if state.count and not state.failed and stop_at is not None and (
                time.monotonic() > stop_at):
            state.stopped = True
            raise TimeUp
        state.count += 1
        try:
            return inner(*args, **kw)
        except UnsatisfiedAssumption:
            raise  # assume() or a filter: hypothesis' control flow, not a failure
        except Exception:
            state.failed = True
            raise

    fn.hypothesis.inner_test = counted  # type: ignore[attr-defined]
    try:
        yield state
    finally:
        fn.hypothesis.inner_test = inner  # type: ignore[attr-defined]


def _runner(fn: Callable, kwargs: dict,
            fixtures: list[Callable[[], object]]) -> Callable[[int, float | None], int]:
    """call(n, seconds): run the hypothesis test `fn` for up to n fresh examples within a
    time slice (`time_slice`); return how many examples ran (rejected ones included), or
    raise TargetFailed with the traceback and hypothesis' report."""
    from hypothesis import HealthCheck, settings
    from hypothesis.reporting import with_reporter

    def call(n: int, seconds: float | None) -> int:
        own = getattr(fn, "_hypothesis_internal_use_settings", None)
        reports: list[object] = []
        # A test's own @settings cannot be re-decorated; hypothesis reads this attribute at
        # call time, so replacing it (for this call) sets the number of examples.
        fn._hypothesis_internal_use_settings = settings(  # type: ignore[attr-defined]
            own, max_examples=n, deadline=None, database=None, derandomize=False,
            suppress_health_check=list(HealthCheck))
        try:
            with (time_slice(fn, seconds) as state, warnings.catch_warnings(),
                  _applied(fixtures), with_reporter(reports.append)):
                warnings.simplefilter("error")  # as in pytest: a warning is a failure
                fn(**kwargs)
        except TimeUp:
            pass
        except Exception:
            text = "\n".join([traceback.format_exc(limit=2), *map(str, reports)])
            raise TargetFailed(state.count, text) from None
        finally:
            fn._hypothesis_internal_use_settings = own  # type: ignore[attr-defined]
        return state.count

    return call


def topic_of(stem: str) -> str | None:
    """The claim topic a parity test module belongs to: `test_<topic>` or
    `test_<topic>_<part>` (test_numerics_gpt.py is part of numerics). Topics contain
    underscores (loss_scaling), so the longest topic that matches wins; None when no topic
    matches."""
    from parity.claims import TOPICS

    name = stem.removeprefix("test_")
    matches = [t for t in TOPICS if name == t or name.startswith(f"{t}_")]
    return max(matches, key=len, default=None)


def discover(topic: str | None, device: str) -> tuple[list[Target], list[str]]:
    """(targets, left out: one line per @given test this command cannot drive, saying why).
    A topic's targets come from parity/test_<topic>.py and every parity/test_<topic>_<part>.py
    (`topic_of`); a test module that belongs to no claim topic is left out, saying so."""
    targets, left_out = [], []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        owner = topic_of(path.stem)
        if topic is not None and owner != topic:
            continue
        if owner is None:
            left_out.append(f"{path.stem}: belongs to no claim topic (parity/claims TOPICS)")
            continue
        module = importlib.import_module(f"parity.{path.stem}")
        fixtures = _autouse_fixtures(module)
        for name, fn in vars(module).items():
            if name.startswith("test_") and isinstance(fn, type):
                left_out.append(f"{path.stem}::{name}: a state machine (pytest runs it)")
                continue
            if not (name.startswith("test_") and hasattr(fn, "hypothesis")):
                continue
            if any(m.name in ("slow", "cuda") for m in getattr(fn, "pytestmark", [])):
                continue
            if fixtures is None:
                left_out.append(f"{path.stem}::{name}: its module's autouse fixture needs "
                                "pytest")
                continue
            wanted = set(inspect.signature(fn).parameters)
            for params in _parametrizations(fn):
                extra = wanted - set(params)
                if extra - {"device"}:
                    left_out.append(f"{path.stem}::{name}: needs the fixtures "
                                    f"{', '.join(sorted(extra - {'device'}))}")
                    break
                kwargs = {**params, **({"device": device} if "device" in extra else {})}
                label = f"{path.stem}::{name}" + (
                    f"[{','.join(map(str, params.values()))}]" if params else "")
                targets.append(Target(label, owner, _runner(fn, kwargs, fixtures)))
    return targets, left_out


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

    from parity.cli import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK

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
    """Fuzz for `seconds`; print the summary; return the exit status (parity/cli/fuzz.py)."""
    from parity.cli import EXIT_FAILED

    seed = random.randrange(2**32) if seed is None else seed
    found, left_out = discover(topic, device)
    if not found:
        print(f"no fuzz targets found{f' for topic {topic}' if topic else ''}", file=sys.stderr)
        return EXIT_FAILED
    text, status = run_targets(found, left_out, seconds, seed)
    print(text)
    return status
