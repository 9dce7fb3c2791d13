"""`python -m parity miniproject`: its pieces see what they grade."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from parity.lab.runners import miniproject as mp

ROOT = Path(__file__).resolve().parent.parent


def test_the_underflow_guard_fails_on_the_fault_and_passes_on_the_repair() -> None:
    pm = mp.postmortem()
    assert pm.zeros["fp16, S=1"]["0.weight"] > 0.05  # the fault is really there
    assert not pm.guard_before and pm.guard_after
    assert pm.forward_nonfinite == 0 and pm.forward_max < mp.FP16_MAX  # H2 really rejected


def test_the_guard_compares_zeros_per_parameter() -> None:
    fp32 = {"a": 0.0, "b": 0.25}
    assert mp.guard_no_underflow({"a": 0.0, "b": 0.25}, fp32)
    assert not mp.guard_no_underflow({"a": 0.0, "b": 0.26}, fp32)
    assert not mp.guard_no_underflow({"a": 0.01, "b": 0.0}, fp32)


def _files(folder: Path, names_in_order: list[str]) -> None:
    """Files written in this order, one second apart (explicit mtimes: no clock race)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names_in_order):
        (folder / name).write_text(name)
        os.utime(folder / name, ns=(10**18 + i * 10**9, 10**18 + i * 10**9))


@pytest.mark.parametrize("order, first", [
    (["predictions.json", "predictions.md", "profile.json", "trace.json"], True),
    (["predictions.json", "profile.json", "predictions.md", "trace.json"], False),  # md late
    (["trace.json", "predictions.json", "predictions.md", "profile.json"], False),
    (["predictions.json", "profile.json", "trace.json"], False),  # no predictions.md
    (["predictions.json", "predictions.md"], False),  # nothing measured
])
def test_the_sheet_counts_as_first_only_if_both_its_files_precede_every_measurement(
        tmp_path: Path, order: list[str], first: bool) -> None:
    _files(tmp_path / "profile", order)
    ok, why = mp.sheet_first(tmp_path / "profile")
    assert ok is first, why


@pytest.mark.slow
def test_the_profile_command_writes_both_sheet_files_before_any_measurement(
        tmp_path: Path) -> None:
    """The real `python -m parity profile` run the mini-project makes: predictions.json and
    predictions.md exist and are older than every measurement file it writes."""
    done = subprocess.run([sys.executable, "-m", "parity", "profile", "--impl", "torch",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert len([p for p in tmp_path.iterdir() if p.name not in mp.SHEET]) >= 3
    ok, why = mp.sheet_first(tmp_path)
    assert ok, why


@pytest.mark.slow
def test_a_process_killed_while_committing_a_checkpoint_resumes_to_the_same_digest(
        tmp_path: Path) -> None:
    ev = mp.resume_evidence(tmp_path)
    assert ev.killed and ev.leftover_temp, "the kill must land inside the commit"
    assert set(ev.before_kill) <= set(ev.survivors)
    assert f"ckpt-{mp.KILL_AT:08d}.ckpt" not in ev.survivors
    assert ev.exact, (ev.digest_resumed, ev.digest_uninterrupted)


@pytest.mark.slow
def test_the_command_writes_every_deliverable_and_grades_them(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "parity", "miniproject", "--out",
                           str(tmp_path), "--repeats", "3"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    for name in ("postmortem.md", "resume.md", "optimize-autocast-bf16.md", "rubric.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    rubric = (tmp_path / "rubric.md").read_text()
    assert "| resume | Strong |" in rubric and "| fault repair | Strong |" in rubric
    assert "| prediction before measurement | Pass |" in rubric
    assert done.stdout.strip().splitlines()[-1].startswith("miniproject: ")
