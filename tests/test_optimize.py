"""`python -m parity optimize`: the gauntlet's parts each fail when their property fails.

The equivalence claims it runs are the parity claims' own checks (tested in parity/); here:
the spec parser, the speedup statistics against an independent computation, and runs of the
gauntlet whose learning or resume is broken on purpose.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parity.drivers import optimize as drv

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("bad", ["compile-ish", "autocast-fp8", "loader-workers:0",
                                 "loader-workers:x", "recompute"])
def test_unknown_or_malformed_optimizations_are_refused_naming_the_accepted_ones(bad: str
                                                                                 ) -> None:
    with pytest.raises(ValueError, match=r"accepted|needs a whole N"):
        drv.parse(bad)


def test_the_cli_refuses_a_bad_spec_in_one_line_with_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "parity", "optimize", "--what", "turbo",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "turbo" in done.stderr


def test_speedup_is_the_ratio_of_medians_and_its_interval_brackets_it() -> None:
    rng = np.random.default_rng(1)
    base = 2.0 + rng.random(15) * 0.1
    fast = 1.0 + rng.random(15) * 0.1
    ratio, low, high = drv.speedup(base, fast)
    assert ratio == pytest.approx(statistics.median(base) / statistics.median(fast), rel=1e-12)
    assert 1.0 < low <= ratio <= high
    same, low, high = drv.speedup(base, base.copy())
    assert same == 1.0 and low <= 1.0 <= high  # identical samples: a null result


def test_an_optimization_that_stops_learning_fails_the_learning_control() -> None:
    broken = drv.Optimization("lr-1e-7", {"lr": 1e-7})  # learns nothing
    g = drv.run_gauntlet(broken, repeats=3, steps=1, learn_steps=30)
    assert not g.learning["optimized"].in_band and not g.passed
    assert g.resume[0] == 0 and g.resume[2]  # it is the learning control that failed


def test_a_resume_that_drops_the_optimizer_state_fails_the_resume_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from torch_impl import train as torch_train

    load = torch_train.Run.load_state_dict
    monkeypatch.setattr(torch_train.Run, "load_state_dict",
                        lambda self, state, omit=(): load(self, state, ("optimizer",)))
    mismatches, n, same = drv.resume_check(drv.parse("autocast-bf16"))
    assert mismatches > 0 and n > 0 and not same


def test_the_command_writes_its_report_and_ends_with_the_verdict(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "parity", "optimize", "--what",
                           "recompute:uniform:2", "--repeats", "3", "--steps", "1", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("optimize: recompute:uniform:2 PASS, speedup ")
    record = json.loads((tmp_path / "optimize-recompute-uniform-2.json").read_text())
    assert len(record["timing"]["baseline_cpu"]) == 3 and record["passed"] is True
    assert record["resume"][0] == 0 and record["resume"][1] > 0 and record["resume"][2]
    assert all(r["accuracy"] >= drv.ACCURACY for r in record["learning"].values())
    assert "## Resume" in (tmp_path / "optimize-recompute-uniform-2.md").read_text()
