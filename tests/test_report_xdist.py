"""The report on pytest-xdist: a worker that crashes fails the report naming its test, and a
claim's n does not depend on which files share a process (NOTE [ A claim's n is the claim's ]
in conftest.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from parity.lab.report import rows_of
from parity.tolerances import claim

ROOT = Path(__file__).resolve().parents[1]

CRASHING = """
import os
import signal

import numpy as np

from parity.compare import assert_claim


def test_asserts_a_claim_then_its_worker_dies() -> None:
    assert_claim("formats.decode", actual=np.zeros(3), expected=np.zeros(3))
    os.kill(os.getpid(), signal.SIGKILL)
"""
HOLDING = """
import numpy as np

from parity.compare import assert_claim


def test_holds() -> None:
    assert_claim("formats.decode", actual=np.ones(2), expected=np.ones(2))
"""


def test_a_worker_that_crashes_fails_the_report_naming_its_test(tmp_path: Path) -> None:
    """Under xdist each worker hands its record back when it ends; a worker killed while
    running a test hands back none. The report reads that test as failed, asserting no claim
    it could see, and names it: the table can never turn a crash into a green row."""
    from parity.lab import report

    (tmp_path / "conftest.py").write_text(
        "from hypothesis import settings\nsettings.register_profile('report')\n")
    (tmp_path / "test_crash.py").write_text(CRASHING)
    (tmp_path / "test_hold.py").write_text(HOLDING)
    files = [tmp_path / "test_crash.py", tmp_path / "test_hold.py"]
    assert report.workers(len(files)) == 2 or os.cpu_count() == 1
    try:
        ran = report.run_tests(files, extra=("--max-worker-restart", "0"))
    except report.TestsDidNotRun as e:  # xdist itself failed on the crash (some versions)
        assert "test_crash.py::test_asserts_a_claim_then_its_worker_dies" in str(e), str(e)
        return
    result = rows_of((claim("formats.decode"),), ran)
    crashed = [line for line in result.unclaimed_failures if "test_crash.py" in line]
    assert crashed, (result.unclaimed_failures, ran["tests"])
    assert "crashed" in crashed[0] or "died" in crashed[0], crashed


def test_a_derandomized_run_has_imported_every_local_module_before_its_first_example(
        ) -> None:
    """NOTE [ A claim's n is the claim's ] (conftest.py): import_local_modules leaves no
    module of the project's packages (test files aside) unimported, so hypothesis has seen
    the same local source in every process; and the report's Inductor cache, from which
    Inductor loads generated modules, lies under a folder named `tests`."""
    import importlib.util
    import sys

    import conftest

    conftest.import_local_modules()
    missing = []
    for package in conftest.LOCAL_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.stem.startswith("test_") or "__pycache__" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if name in conftest.ADAPTERS:
                continue
            if name not in sys.modules and importlib.util.find_spec(name) is not None:
                missing.append(name)
    assert missing == []
    imports = re.compile(r"^\s*(from|import)\s+parity\.lab\.your_trainer(\.callbacks|"
                         r"\s+import\s+.*\bcallbacks)", re.MULTILINE)
    importers = [str(p.relative_to(ROOT)) for package in conftest.LOCAL_PACKAGES
                 for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts
                 and not p.stem.startswith("callbacks")
                 and imports.search(p.read_text(encoding="utf-8"))]
    assert importers == [], "a module importing an adapter makes a worker see it"
    source = (ROOT / "parity" / "lab" / "report.py").read_text(encoding="utf-8")
    assert 'Path(tmp) / "tests" / "inductor"' in source


@pytest.mark.slow  # two pytest runs of two files each: about 25 s on 2 cores
def test_a_claims_n_does_not_depend_on_the_files_run_before_it() -> None:
    """loss_scaling's claims observe the same n run alone and after test_formats_small.py
    in the same process (where hypothesis' local constants once moved loss_scaling.scaler's n
    from 10,972 to 10,195), and under xdist."""
    from parity.lab import report

    alone = report.run_tests([report.PARITY / "test_loss_scaling.py"])
    after = report.run_tests([report.PARITY / "test_formats_small.py",
                              report.PARITY / "test_loss_scaling.py"], extra=("-n", "0"))
    spread = report.run_tests([report.PARITY / "test_formats_small.py",
                               report.PARITY / "test_loss_scaling.py"])
    ns = [{cid: o["n"] for cid, o in ran["claims"].items() if cid.startswith("loss_scaling.")}
          for ran in (alone, after, spread)]
    assert ns[0] and ns[0] == ns[1] == ns[2], ns


class _Config:
    """What conftest.pytest_configure reads of a pytest config: its options, and
    `workerinput` on an xdist worker."""

    def __init__(self, profile: str, numprocesses: int | None, worker: bool) -> None:
        self.options = {"hypothesis_profile": profile, "numprocesses": numprocesses}
        if worker:
            self.workerinput = {}

    def getoption(self, name: str, default: object = None) -> object:
        return self.options.get(name, default)


def test_configure_imports_every_local_module_under_a_derandomized_profile_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The root conftest's pytest_configure calls import_local_modules under the report and
    ci profiles (derandomized), in a process that runs tests (one alone, an xdist worker),
    and not under dev or fuzz, nor in xdist's controller. (A process of its own where a
    module no test imports is loaded: the slow test below.)"""
    import conftest

    calls: list[str] = []
    monkeypatch.setattr(conftest, "import_local_modules", lambda: calls.append("x") or [])
    cases = {("report", None, False): 1, ("report", 2, True): 1, ("ci", 0, False): 1,
             ("report", 2, False): 0, ("dev", None, False): 0, ("fuzz", 2, True): 0}
    for (profile, n, worker), expected in cases.items():
        calls.clear()
        conftest.pytest_configure(_Config(profile, n, worker))  # type: ignore[arg-type]
        assert len(calls) == expected, (profile, n, worker)


@pytest.mark.slow  # a pytest process importing the whole project: ~5 s idle, ~11 s busy
def test_a_derandomized_pytest_run_has_every_local_module_loaded_at_its_first_test(
        tmp_path: Path) -> None:
    """The root conftest, under the report profile, has imported every local module before
    the first test runs (NOTE [ A claim's n is the claim's ]), in a process of its own: a
    module no test imports is loaded. (That a profile which is not derandomized imports
    nothing for it is a saving of ~2 s per process, not a property of a claim: not tested.)"""
    probe = tmp_path / "test_probe.py"
    probe.write_text("import sys\n\nfrom hypothesis import settings\n\n\n"
                     "def test_probe() -> None:\n"
                     "    assert settings.default.derandomize\n"
                     "    assert 'parity.lab.gendocs.versions' in sys.modules\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-p", "no:benchmark", "-o", "addopts=", "--rootdir", str(tmp_path),
         str(probe), "--hypothesis-profile=report"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=300, check=False)
    assert done.returncode == 0, (done.stdout[-1500:], done.stderr[-1500:])


def test_the_workers_are_xdists_auto_count_when_it_is_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """PYTEST_XDIST_AUTO_NUM_WORKERS (xdist's own knob for `-n auto`) caps the report's
    workers as the cores do: 1 gives one process (0, no xdist), 3 gives three for 5 files
    and two for 2."""
    from parity.lab import report

    for given, files, expected in (("1", 5, 0), ("3", 5, 3), ("3", 2, 2), ("3", 1, 0)):
        monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", given)
        assert report.workers(files) == expected, (given, files)
