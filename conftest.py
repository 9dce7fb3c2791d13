"""Shared pytest setup: hypothesis profiles, the --device option and the fuzz profile's time
budget.

Profiles:
    dev   default: 100 examples, no deadline (a noisy 2-core machine);
    ci    selected automatically when the CI environment variable is set: derandomized, no deadline;
    fuzz  pytest parity/ --hypothesis-profile=fuzz [--fuzz-seconds T | --fuzz-total S]
          (registered by parity/fuzz_plugin.py, with its time budget: below);
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

The fuzz profile and its time budget are a plugin of their own, loaded below
(parity/fuzz_plugin.py, NOTE [ A fuzz run's time ]): every @given test gets up to 20,000
examples or its time slice, whichever comes first. `--fuzz-seconds T` gives each @given test T
seconds (default 5) and runs the rest of the suite as usual; `--fuzz-total S`, what
`python -m parity fuzz --seconds S` runs, deselects the tests that are not @given tests and
shares S seconds of wall time among the @given ones, across pytest-xdist's workers, skipping
(and exiting 4) any it could not reach in time. The summary at the end lists the examples each
test got, gathered from every worker.
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

from parity import setting

# The claims' setting (parity/setting.py). One thread for NumPy's BLAS: OpenBLAS reads this
# once, when NumPy is first imported, which is after this line (pytest, hypothesis and
# parity/__init__ do not import NumPy). On a shared 2-core machine BLAS's second thread also
# spins waiting for a core. Training subprocesses get the same through OMP_NUM_THREADS=1
# (parity/drivers/train.py). An explicit setting is kept.
setting.pin_blas()

# NOTE [ The suite keeps its bytecode ]
# The suite starts the project in about a hundred subprocesses (the command line as users run
# it, the report's and fuzz's own pytest sessions, the ranks), and each xdist worker imports
# every test file. Under PYTHONDONTWRITEBYTECODE=1 (set on some machines, this project's CI
# machine among them) each of those processes compiled every module from source again, and
# pytest rewrote every test file's asserts again: about 14% of the suite's CPU time, measured.
# The suite therefore writes bytecode, for itself (test files imported from here on) and for
# the processes it starts, into the __pycache__ folders git ignores; a folder that cannot be
# written is skipped by Python as usual.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# MIRRORTRAIN_WITHOUT=torchao[,name...]: run as if those packages were not installed (each
# import of one raises ImportError: None in sys.modules), so the suite's and the report's
# behaviour without an optional extra is checked without uninstalling it (tests/test_report.py).
for _name in filter(None, os.environ.get("MIRRORTRAIN_WITHOUT", "").split(",")):
    sys.modules[_name.strip()] = None  # type: ignore[assignment]

# derandomize said in each: a profile inherits the default's, which hypothesis itself makes
# derandomized where the CI variable is set (a fuzz run there drew the same examples always)
settings.register_profile("dev", max_examples=100, deadline=None, derandomize=False)
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
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


# the frameworks' adapters for resume-check (transformers' and Lightning's callbacks): no
# parity test imports them, so no report worker ever sees them, and importing them costs
# those frameworks' imports (~1.8 s measured) in every derandomized process
ADAPTERS = ("parity.lab.your_trainer.callbacks", "parity.lab.your_trainer.callbacks_lightning")


def import_local_modules() -> list[str]:
    """Import every module of LOCAL_PACKAGES but the test files and ADAPTERS (NOTE [ A
    claim's n is the claim's ]); return those that could not be imported here (an optional
    extra missing), which then are missing in every process alike."""
    import importlib
    import pkgutil

    failed = []
    for package in LOCAL_PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            if info.name.rsplit(".", 1)[-1].startswith("test_") or info.name in ADAPTERS:
                continue
            try:
                importlib.import_module(info.name)
            except ImportError:
                failed.append(info.name)
    return failed

# the fuzz profile and its options (--fuzz-seconds, --fuzz-total), time slices and summary
pytest_plugins = ("parity.fuzz_plugin",)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        action="store",
        default="cpu",
        choices=("cpu", "cuda"),
        help="device for the torch side of the tests (default: cpu)",
    )


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
    if config.getoption("--device") != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="--device cuda given but torch.cuda.is_available() is False")
        for item in items:
            if "device" in getattr(item, "fixturenames", ()):
                item.add_marker(skip)


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
