"""What `python -m parity fuzz` runs (parity/lab/fuzz.py schedules it): a fuzz target, found
among the hypothesis parity tests and driven for a time slice.

Finding: every `@given` test in parity/test_*.py is a target of its claim topic (a topic's
tests may span parity/test_<topic>.py and parity/test_<topic>_<part>.py: `topic_of`), once
per combination of its `pytest.mark.parametrize` values, with its module's argument-free
autouse fixtures applied (`discover`). Tests that need other fixtures, and state machines,
are left out, each with a line saying why.
Driving: a target is called directly (hypothesis tests accept their non-generated arguments
as keywords) for up to n fresh examples, starting none after its slice (`time_slice`, also
conftest.py's fuzz profile); a failure comes back as TargetFailed with the traceback and
hypothesis' falsifying example.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import itertools
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path


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
