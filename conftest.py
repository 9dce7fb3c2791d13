"""Shared pytest setup: hypothesis profiles, the --device option and the fuzz profile's time
budget.

Profiles:
    dev   default: 100 examples, no deadline (a noisy 2-core machine);
    ci    selected automatically when the CI environment variable is set: derandomized, no deadline;
    fuzz  pytest parity/ --hypothesis-profile=fuzz [--fuzz-seconds T]
    report  what `python -m parity report` runs: derandomized, at most REPORT_EXAMPLES
          examples per @given test (explicit @settings capped), so the report is quick and
          its table the same on every run of the same test files in the same processes.
          Not the same across groupings: hypothesis (6.13x on) also draws literal
          constants found in every local module loaded when an example is made, so the
          examples of a test, and a claim's n, depend on which other test files (and the
          modules they import) share its process (loss_scaling.scaler's n moves by a
          few percent with the file run before test_loss_scaling.py; the verdicts do
          not). The report's groups come
          from the committed costs (docs/data/report_cost.json), so its n changes only
          when they are recorded again, and a --topic run's n can differ from the table
          docs/claims/ prints.

The fuzz profile has a bounded, stated duration. hypothesis settings cannot take a time, and
the tests' costs per example differ by a factor of ~1000 (a float cast vs a training run),
so a flat example count either barely fuzzes the cheap tests or spends many minutes in one
expensive test. Instead every @given test gets up to 20,000 examples OR T seconds
(--fuzz-seconds, default FUZZ_SECONDS), whichever comes first: its own @settings budget is
raised to the profile's, and while it runs, parity.fuzz_targets.time_slice stops it from
starting a new example after T seconds (never while a failure is being shrunk; the test then passes
with the examples it ran). So `pytest parity/ --hypothesis-profile=fuzz` takes at most
(number of @given tests) x T plus the rest of the suite: 66 tests x 5 s + ~2 minutes, about
7.5 minutes on 2 cores, and the summary at the end lists the examples each test got.
State machines keep their own budgets (hypothesis runs them through unittest).
"""

from __future__ import annotations

import os
import sys
import time

import pytest
from hypothesis import HealthCheck, settings

from parity import setting

# The claims' setting (parity/setting.py). One thread for NumPy's BLAS: OpenBLAS reads this
# once, when NumPy is first imported, which is after this line (pytest, hypothesis and
# parity/__init__ do not import NumPy). On a shared 2-core machine BLAS's second thread also
# spins waiting for a core. Training subprocesses get the same through OMP_NUM_THREADS=1
# (parity/drivers/train.py). An explicit setting is kept.
setting.pin_blas()

# MIRRORTRAIN_WITHOUT=torchao[,name...]: run as if those packages were not installed (each
# import of one raises ImportError: None in sys.modules), so the suite's and the report's
# behaviour without an optional extra is checked without uninstalling it (tests/test_report.py).
for _name in filter(None, os.environ.get("MIRRORTRAIN_WITHOUT", "").split(",")):
    sys.modules[_name.strip()] = None  # type: ignore[assignment]

FUZZ_SECONDS = 5.0  # default time budget per @given test under the fuzz profile

settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz",
    max_examples=20_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# `python -m parity report`: the parity tests, quickly and reproducibly (parity/lab/report.py);
# tests with their own larger @settings(max_examples=n) are capped to this count too.
REPORT_EXAMPLES = 8
settings.register_profile(
    "report",
    max_examples=REPORT_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# nodeid -> (examples, seconds, stopped by the time budget), for the fuzz summary
_FUZZED: dict[str, tuple[int, float, bool]] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        action="store",
        default="cpu",
        choices=("cpu", "cuda"),
        help="device for the torch side of the tests (default: cpu)",
    )
    parser.addoption(
        "--fuzz-seconds",
        action="store",
        type=float,
        default=FUZZ_SECONDS,
        help=f"with --hypothesis-profile=fuzz: seconds per @given test (default "
             f"{FUZZ_SECONDS:g}); each stops at 20,000 examples or this, whichever is first",
    )


def _fuzz_seconds(config: pytest.Config) -> float | None:
    """The per-test time budget when the fuzz profile is selected, else None."""
    if config.getoption("hypothesis_profile", None) != "fuzz":
        return None
    seconds = config.getoption("--fuzz-seconds")
    if not seconds > 0 or seconds == float("inf"):
        raise pytest.UsageError(f"--fuzz-seconds {seconds}: must be a finite number > 0")
    return seconds


def _set_explicit_budgets(items: list[pytest.Item], cap: bool = False) -> None:
    """Under the fuzz profile, give every test with its own @settings(max_examples=n) the
    profile's max_examples: the time budget, not the small everyday count, ends it (explicit
    settings otherwise win over the profile); under the report profile (cap), at most the
    profile's count. hypothesis reads this attribute at call time."""
    done: set[int] = set()
    for item in items:
        fn = getattr(item, "obj", None)
        own = getattr(fn, "_hypothesis_internal_use_settings", None)
        if own is None or id(fn) in done:
            continue
        done.add(id(fn))
        examples = settings.default.max_examples
        if cap:
            examples = min(own.max_examples, examples)
        fn._hypothesis_internal_use_settings = settings(  # type: ignore[union-attr]
            own, max_examples=examples, deadline=None)


def pytest_configure(config: pytest.Config) -> None:
    """One intra-op thread for torch's CPU kernels. The tests' tensors are tiny, and on a
    shared 2-core machine two threads per op cost far more in contention than they save
    (small ops measured ~1000x slower under load). No claim depends on the thread count:
    bit-exact claims compare runs made with the same setting, bounds hold for any order."""
    setting.pin_torch()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _fuzz_seconds(config) is not None:
        _set_explicit_budgets(items)
    elif config.getoption("hypothesis_profile", None) == "report":
        _set_explicit_budgets(items, cap=True)
    if config.getoption("--device") != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="--device cuda given but torch.cuda.is_available() is False")
        for item in items:
            if "device" in getattr(item, "fixturenames", ()):
                item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):  # type: ignore[no-untyped-def]
    """Under the fuzz profile, run each @given test inside its time budget (module docstring);
    running out of time is a normal end, not a failure."""
    seconds = _fuzz_seconds(pyfuncitem.config)
    fn = pyfuncitem.obj
    if seconds is None or not hasattr(fn, "hypothesis"):
        yield
        return
    from parity.fuzz_targets import TimeUp, time_slice

    began = time.monotonic()
    with time_slice(fn, seconds) as state:
        outcome = yield
    if outcome.excinfo is not None and isinstance(outcome.excinfo[1], TimeUp):
        outcome.force_result(True)
    _FUZZED[pyfuncitem.nodeid] = (state.count, time.monotonic() - began, state.stopped)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Under the fuzz profile: how many examples each @given test got, fewest first."""
    seconds = _fuzz_seconds(terminalreporter.config)
    if seconds is None or not _FUZZED:
        return
    tr = terminalreporter
    tr.section(f"fuzz profile: up to 20,000 examples or {seconds:g} s per @given test")
    for nodeid, (count, spent, stopped) in sorted(_FUZZED.items(), key=lambda kv: kv[1][0]):
        why = "time budget" if stopped else "all examples"
        tr.write_line(f"{count:>7,} examples {spent:>6.1f} s  ({why})  {nodeid}")
    total = sum(c for c, _, _ in _FUZZED.values())
    spent = sum(s for _, s, _ in _FUZZED.values())
    tr.write_line(f"{len(_FUZZED)} @given tests, {total:,} examples in {spent:.0f} s")


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """The torch device the test runs on: the --device option ("cpu" unless told otherwise)."""
    return request.config.getoption("--device")


@pytest.fixture
def cuda_device() -> str:
    """For tests marked cuda: a CUDA device, or a skip that says why there is none."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False")
    return "cuda"
