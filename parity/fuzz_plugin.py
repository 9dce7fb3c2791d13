"""The hypothesis profile `fuzz` and its time budget: a pytest plugin the root conftest.py
loads (`pytest_plugins`). `python -m parity fuzz` is a front for it (parity/lab/fuzz.py).

    pytest parity/ --hypothesis-profile=fuzz [--fuzz-seconds T]  every test; @given ones T s each
    pytest parity/ --hypothesis-profile=fuzz --fuzz-total S      only the @given tests, S s in all

hypothesis settings cannot take a time, and the tests' costs per example differ by a factor
of ~1000 (a float cast vs a training run), so a flat example count either barely fuzzes the
cheap tests or spends many minutes in one expensive test. Under this profile every @given
test gets up to FUZZ_EXAMPLES examples (its own budget raised through
parity.strategies.examples) OR its time slice, whichever comes first: `time_slice` starts no
new example once the slice is spent (never while a failure is being shrunk, and never before
the first: a slice runs at least one example), and the test then passes with the examples it
ran. The profile prints `@reproduce_failure` beside hypothesis' falsifying example.

NOTE [ A fuzz run's time ]
--fuzz-seconds T: each @given test's slice is T s from its call; the rest of the suite runs as
usual. --fuzz-total S (what `python -m parity fuzz --seconds S` runs): the tests that are not
@given tests are deselected (they are no fuzz targets), and S seconds of wall time, counted in
each process from the end of its collection, are shared out as the tests start. A test's
slice is set before its fixtures are made (their time is counted in it):

    left  = S - (seconds since the end of collection)
    slice = min(left * W / waiting, left / (1 + after))

W: the workers with a file to run (pytest-xdist's, at most one per file; 1 without xdist);
waiting: the @given tests not yet started in any process, this one included (the processes
count starts in one shared file); after: the tests after this one in its own file, which
`--dist loadfile` runs on the same worker, so a worker always leaves time for the rest of its
file. A test that runs longer than its share (a slow first example, a module fixture) leaves
less for those after it; a slice overruns by at most one example. A test reached when nothing
is left is skipped ("not reached") and the run exits EXIT_INCOMPLETE (4, as the command
line's; otherwise pytest's status, 1 when a test failed): a budget shorter than the first
examples of all the tests ends incomplete, never silently long.

The summary at the end lists every @given test with the examples it ran, its seconds and why
it stopped. Under pytest-xdist a test's tally reaches the controller, which prints the
summary, in its report's `user_properties` (pytest hands them over with every report).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

FUZZ_EXAMPLES = 20_000  # examples per @given test at most under the fuzz profile
FUZZ_SECONDS = 5.0  # --fuzz-seconds' default: each @given test's slice
EXIT_INCOMPLETE = 4  # --fuzz-total: a test was not reached (parity.lab.cli's EXIT_INCOMPLETE)
KEY = "fuzz"  # a test report's user_properties entry: (examples, seconds, why it stopped)
COUNTER = "mirrortrain_fuzz_counter"  # xdist's workerinput: the file that counts test starts
NOT_REACHED = "not reached"
STOP = pytest.StashKey[float]()  # item.stash: where its slice ends (time.monotonic)

settings.register_profile(
    "fuzz",
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=False,  # said: hypothesis' own default is derandomized where CI is set
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


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
def time_slice(fn: Callable, seconds: float) -> Iterator[Slice]:
    """While active, the hypothesis test `fn` counts its examples and starts none after
    `seconds` (but always the first) unless one has failed: it raises TimeUp instead, which
    the caller takes for a normal end. It wraps hypothesis' public `fn.hypothesis.inner_test`.
    hypothesis' own control flow (StopTest, a BaseException, when a draw runs out of data;
    UnsatisfiedAssumption) passes through the test and is not a failure."""
    from hypothesis.errors import UnsatisfiedAssumption

    inner = fn.hypothesis.inner_test  # type: ignore[attr-defined]
    stop_at = time.monotonic() + seconds
    state = Slice()

    @functools.wraps(inner)
    def counted(*args: object, **kw: object) -> object:
        if state.count and not state.failed and time.monotonic() > stop_at:
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


def is_given(item: pytest.Item) -> bool:
    """A fuzz target: a test function hypothesis drives (@given)."""
    return isinstance(item, pytest.Function) and hasattr(item.obj, "hypothesis")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fuzz", "the fuzz profile's time (parity/fuzz_plugin.py)")
    group.addoption("--fuzz-seconds", type=float, default=None, metavar="T",
                    help=f"with --hypothesis-profile=fuzz: seconds per @given test (default "
                         f"{FUZZ_SECONDS:g}); each stops at {FUZZ_EXAMPLES:,} examples or this")
    group.addoption("--fuzz-total", type=float, default=None, metavar="S",
                    help="with --hypothesis-profile=fuzz: run only the @given tests, S seconds "
                         "in all shared equally among them; exit 4 when the budget ran out "
                         "before a test was reached")


def pytest_configure(config: pytest.Config) -> None:
    per_test, total = config.getoption("--fuzz-seconds"), config.getoption("--fuzz-total")
    if config.getoption("hypothesis_profile", None) != "fuzz":
        if per_test is not None or total is not None:
            raise pytest.UsageError("--fuzz-seconds and --fuzz-total need "
                                    "--hypothesis-profile=fuzz")
        return
    if per_test is not None and total is not None:
        raise pytest.UsageError("give --fuzz-seconds (per test) or --fuzz-total (in all), "
                                "not both")
    for name, value in (("--fuzz-seconds", per_test), ("--fuzz-total", total)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise pytest.UsageError(f"{name} {value}: must be a finite number > 0")
    config.pluginmanager.register(FuzzRun(config, per_test, total), "mirrortrain-fuzz")


@dataclass
class Tally:
    examples: int
    seconds: float
    why: str  # why it stopped: "time slice", "all examples", "FAILED", NOT_REACHED


@dataclass(eq=False)  # a plugin: hashed by identity
class FuzzRun:
    """This process's part of a fuzz run (NOTE [ A fuzz run's time ])."""

    config: pytest.Config
    per_test: float | None
    total: float | None
    deadline: float = math.inf
    targets: int = 0  # the @given tests selected, in every process alike
    workers: int = 1  # the processes that run tests and have a file to run
    after: dict[str, int] = field(default_factory=dict)  # nodeid -> its file's tests after it
    counter: str | None = None  # the file counting test starts across processes
    owns_counter: bool = False
    tallies: dict[str, Tally] = field(default_factory=dict)  # nodeid ->, where reports arrive

    def __post_init__(self) -> None:
        worker = getattr(self.config, "workerinput", None)
        if self.total is None:
            return
        if worker is not None:
            self.counter = worker[COUNTER]
        else:
            fd, self.counter = tempfile.mkstemp(prefix="mirrortrain-fuzz-")
            os.close(fd)
            self.owns_counter = True

    @property
    def is_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist's controller, per worker: the shared counter."""
        node.workerinput[COUNTER] = self.counter

    def pytest_unconfigure(self) -> None:
        if self.owns_counter and self.counter is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.counter)

    @pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs
    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        if self.total is None:
            return
        kept = [i for i in items if is_given(i)]
        dropped = [i for i in items if not is_given(i)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        files = Counter(str(i.path) for i in kept)
        seen: Counter[str] = Counter()
        for i in kept:
            seen[str(i.path)] += 1
            self.after[i.nodeid] = files[str(i.path)] - seen[str(i.path)]
        self.targets = len(kept)
        count = int(getattr(config, "workerinput", {}).get("workercount", 1))
        self.workers = max(1, min(count, len(files)))
        self.deadline = time.monotonic() + self.total

    def _started(self) -> int:
        """Count this test's start in the shared file; the starts so far, this one included."""
        assert self.counter is not None
        fd = os.open(self.counter, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b".")  # one byte per start: appends are atomic, the size a count
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """--fuzz-total: this test's slice, or a skip when the budget is spent."""
        if self.total is None or not is_given(item):
            return
        now = time.monotonic()
        left = self.deadline - now
        if left <= 0:
            item.user_properties.append((KEY, (0, 0.0, NOT_REACHED)))
            pytest.skip(f"--fuzz-total {self.total:g}: the budget ran out before this test")
        waiting = max(1, self.targets - self._started() + 1)
        share = min(left * self.workers / waiting, left / (self.after.get(item.nodeid, 0) + 1))
        item.stash[STOP] = now + share

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Any:
        """A @given test inside its time slice; running out of time is a normal end."""
        fn = pyfuncitem.obj
        if not hasattr(fn, "hypothesis"):
            return (yield)
        began = time.monotonic()
        stop = pyfuncitem.stash.get(STOP, began + (self.per_test or FUZZ_SECONDS))
        with time_slice(fn, stop - began) as state:
            try:
                return (yield)
            except TimeUp:
                return True
            finally:
                why = "time slice" if state.stopped else "all examples"
                pyfuncitem.user_properties.append(
                    (KEY, (state.count, time.monotonic() - began, why)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Where the reports arrive (xdist's controller, or the one process): the tallies."""
        if self.is_worker or not (report.when == "call" or report.skipped):
            return
        for key, value in report.user_properties:
            if key == KEY:
                examples, seconds, why = value  # type: ignore[misc]
                self.tallies[report.nodeid] = Tally(examples, seconds,
                                                    "FAILED" if report.failed else why)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if (self.total is not None and not self.is_worker and session.exitstatus == 0
                and any(t.why == NOT_REACHED for t in self.tallies.values())):
            session.exitstatus = EXIT_INCOMPLETE

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """Every @given test's examples, fewest first, and one line for the whole run."""
        if self.is_worker or not self.tallies:
            return
        tr = terminalreporter
        budget = (f"{self.total:g} s in all (--fuzz-total)" if self.total is not None
                  else f"{self.per_test or FUZZ_SECONDS:g} s per @given test")
        tr.section(f"fuzz profile: up to {FUZZ_EXAMPLES:,} examples per test, {budget}")
        for nodeid, t in sorted(self.tallies.items(), key=lambda kv: kv[1].examples):
            tr.write_line(f"{t.examples:>7,} examples {t.seconds:>6.1f} s  ({t.why})  {nodeid}")
        ran = [t for t in self.tallies.values() if t.why != NOT_REACHED]
        failing = sum(t.why == "FAILED" for t in ran)
        missed = len(self.tallies) - len(ran)
        seed = self.config.getoption("hypothesis_seed", None)
        tr.write_line(
            f"fuzz: {len(ran)}/{len(self.tallies)} @given tests ran, "
            f"{sum(t.examples for t in ran):,} examples in {sum(t.seconds for t in ran):.1f} s "
            f"of tests{'' if seed is None else f' (seed {seed})'}, {failing} failing, "
            + (f"INCOMPLETE: the budget ran out before {missed} tests ({NOT_REACHED}): give "
               "more time" if missed else "complete"))
