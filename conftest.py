"""Shared pytest setup: hypothesis profiles, the --device option and the fuzz profile's time
budget.

Profiles:
    dev   default: 100 examples, no deadline (a noisy 2-core machine);
    ci    selected automatically when the CI environment variable is set: derandomized, no deadline;
    fuzz  pytest parity/ --hypothesis-profile=fuzz [--fuzz-seconds T]
    report  what `python -m parity report` runs: derandomized, at most REPORT_EXAMPLES
          examples per @given test (a test's own budget capped: parity.strategies.examples),
          so the report is quick and its table the same on every run, whichever files run
          and however xdist shares them out (NOTE [ A claim's n is the claim's ]).

NOTE [ A claim's n is the claim's ]
A derandomized profile's examples must be a function of the test alone, so that a claim's n
is the same in the full report, in a --topic run, under xdist and alone. hypothesis (6.13x
on) also draws, now and then, a literal constant found in the source of any local module it
has seen loaded (not a test file, not one under a folder named `tests`), so the examples
depended on which modules were imported before an example was made: which test files shared
the process, and which modules their tests had imported lazily by then. Under a derandomized
profile (ci, report) the conftest therefore imports every module of the project's packages
(LOCAL_PACKAGES) before any test runs, so every process has seen the same local source from
its first example on; and the code Inductor generates, which it loads as modules from its
cache folder, is kept out by giving the report's Inductor cache a folder named `tests`
(parity/lab/report.py INDUCTOR_CACHE). No hypothesis setting or attribute is touched.

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

# the project's packages, every module of which a derandomized run imports first
# (NOTE [ A claim's n is the claim's ])
LOCAL_PACKAGES = ("ckpt", "common", "reference", "torch_impl", "parity")


def import_local_modules() -> list[str]:
    """Import every module of LOCAL_PACKAGES but the test files (NOTE [ A claim's n is the
    claim's ]); return those that could not be imported here (an optional extra missing),
    which then are missing in every process alike."""
    import importlib
    import pkgutil

    failed = []
    for package in LOCAL_PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            if info.name.rsplit(".", 1)[-1].startswith("test_"):
                continue
            try:
                importlib.import_module(info.name)
            except ImportError:
                failed.append(info.name)
    return failed

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


def pytest_configure(config: pytest.Config) -> None:
    """One intra-op thread for torch's CPU kernels. The tests' tensors are tiny, and on a
    shared 2-core machine two threads per op cost far more in contention than they save
    (small ops measured ~1000x slower under load). No claim depends on the thread count:
    bit-exact claims compare runs made with the same setting, bounds hold for any order.
    Under a derandomized profile, every local module first (NOTE [ A claim's n is the
    claim's ]); not in xdist's controller, which runs no test."""
    setting.pin_torch()
    controller = (not hasattr(config, "workerinput")
                  and config.getoption("numprocesses", None) not in (None, 0))
    profile = config.getoption("hypothesis_profile", None) or (
        "ci" if os.environ.get("CI") else "dev")
    if settings.get_profile(profile).derandomize and not controller:
        import_local_modules()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _fuzz_seconds(config)  # a bad --fuzz-seconds is refused before any test runs
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
