"""The versions the claims call verified (parity.claims.VERIFIED) are the ones a recorded run
verified (docs/data/torch_matrix.json, written by `.ci/torch-matrix --record`), and the
README's quick start, which CI and `.ci/torch-matrix --readme` run as written, is two lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from parity.claims import VERIFIED, release
from parity.lab.gendocs.versions import recorded

ROOT = Path(__file__).resolve().parents[1]
# .ci/torch-matrix sets it in the runs it records: a run cannot hold the record it is making
RECORDING = pytest.mark.skipif(os.environ.get("MIRRORTRAIN_RECORDING") == "1",
                               reason="a .ci/torch-matrix run that is making the record")


@RECORDING
def test_the_verified_versions_are_exactly_the_recorded_runs_that_held() -> None:
    """A version is called verified only where a recorded run of the whole suite and report
    held on it, and every such run's versions are called verified."""
    runs = [r for r in recorded().values() if r["ok"]]
    assert runs, "no recorded run held: .ci/torch-matrix --record has never been run"
    assert set(VERIFIED["torch"]) == {release(r["torch"]) for r in runs}
    assert set(VERIFIED["ml_dtypes"]) == {r["ml_dtypes"] for r in runs}


@RECORDING
def test_the_newest_torch_pip_resolves_was_run_by_the_readmes_own_quick_start() -> None:
    """The newest verified torch was verified the way a newcomer meets it: the README's
    first line in a fresh environment (`--readme`), not a pinned install."""
    runs = recorded()
    newest = max(runs, key=lambda v: tuple(int(p) for p in v.split(".")))
    assert runs[newest]["how"] == "readme", runs[newest]


def test_ci_reads_the_readmes_quick_start_as_two_lines() -> None:
    done = subprocess.run([sys.executable, str(ROOT / ".ci" / "quickstart.py")],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    install, tests = done.stdout.splitlines()
    assert "pip install" in install and "python -m parity report" in install
    assert tests.startswith("pytest")
