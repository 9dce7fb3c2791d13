"""`python -m parity fuzz`: the hypothesis parity tests themselves, for a time budget.

Every `@given` test in parity/test_*.py is a fuzz target: it is called directly (hypothesis
tests accept their non-generated arguments as keywords), once per combination of its
`pytest.mark.parametrize` values, in rounds of a few hundred fresh random examples, until the
budget is spent. Tests that need fixtures other than `device`, and state machines, are left
to `pytest parity/ --hypothesis-profile=fuzz`, which runs everything.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, settings

ROUND = 200  # examples per target per round


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


def targets(topic: str | None, device: str) -> list[tuple[str, Callable[[], None]]]:
    """(label, runner) for every hypothesis test this command can drive."""
    found = []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        if topic is not None and path.stem != f"test_{topic}":
            continue
        module = importlib.import_module(f"parity.{path.stem}")
        for name, fn in vars(module).items():
            if not (name.startswith("test_") and hasattr(fn, "hypothesis")):
                continue
            if any(m.name in ("slow", "cuda") for m in getattr(fn, "pytestmark", [])):
                continue
            # A test's own @settings cannot be re-decorated; hypothesis reads this attribute
            # at call time, so replacing it sets the round size for every target alike.
            fn._hypothesis_internal_use_settings = settings(
                getattr(fn, "_hypothesis_internal_use_settings", None), max_examples=ROUND,
                deadline=None, database=None, derandomize=False,
                suppress_health_check=list(HealthCheck))
            runner = fn
            wanted = set(inspect.signature(fn).parameters)
            for params in _parametrizations(fn):
                extra = wanted - set(params)
                if extra - {"device"}:
                    continue  # needs a fixture this command does not provide
                kwargs = {**params, **({"device": device} if "device" in extra else {})}
                label = f"{path.stem}::{name}[{','.join(map(str, params.values()))}]"
                found.append((label, lambda r=runner, k=kwargs: r(**k)))
    return found


def fuzz(seconds: float, topic: str | None = None, device: str = "cpu") -> int:
    """Run the targets round-robin until `seconds` pass; 1 if any failed."""
    found = targets(topic, device)
    if not found:
        print("no fuzz targets found")
        return 1
    deadline = time.monotonic() + seconds
    failures: dict[str, str] = {}
    rounds = 0
    while time.monotonic() < deadline and len(failures) < len(found):
        rounds += 1
        for label, run in found:
            if label in failures or time.monotonic() >= deadline:
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")  # as in pytest: a warning is a failure
                    run()
            except Exception:
                failures[label] = traceback.format_exc(limit=2)
                print(f"FAILED {label}")
    print(f"{len(found)} targets, {rounds} rounds of up to {ROUND} examples, "
          f"{len(failures)} failing")
    for label, tb in failures.items():
        print(f"\n--- {label}\n{tb}")
    return 1 if failures else 0
