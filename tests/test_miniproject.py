"""`python -m parity miniproject`: its pieces see what they grade."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parity.lab.runners import miniproject as mp

ROOT = Path(__file__).resolve().parent.parent


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
    for name in ("postmortem.md", "postmortem.json", "resume.md", "optimize-autocast-bf16.md",
                 "rubric.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    rubric = (tmp_path / "rubric.md").read_text()
    assert "| resume | Strong |" in rubric
    assert "| fault repair | Strong | postmortem.md: fault fp16_without_scaler;" in rubric
    assert "| prediction before measurement | Strong |" in rubric
    assert "| honest timing (profile) | Strong |" in rubric
    assert done.stdout.strip().splitlines()[-1].startswith("miniproject: ")


# ---------------------------------------------------------------- the rubric, on stand-in evidence

def _evidence(**spoil: object) -> mp.ResumeEvidence:
    """A kill and resume earning Strong, with `spoil` replaced."""
    from dataclasses import replace

    names = [f"ckpt-{s:08d}.ckpt" for s in (5, 10, 15)]
    whole = mp.ResumeEvidence(True, [".ckpt-00000020.ckpt.0a1b2c3d.tmp"], names, names,
                              "resumed from ckpt-00000015.ckpt at step 15", "ab" * 32,
                              "ab" * 32)
    return replace(whole, **spoil)  # type: ignore[arg-type]


@pytest.mark.parametrize("spoil, grade", [
    ({}, "Strong"),
    ({"leftover_temp": []}, "Pass"),  # the kill did not land inside the commit
    ({"killed": False}, "Pass"),
    ({"survivors": ["ckpt-00000005.ckpt", "ckpt-00000015.ckpt"]}, "Pass"),  # one lost
    ({"resumed_from": "resumed from ckpt-00000010.ckpt at step 10"}, "Pass"),  # not the newest
    ({"digest_resumed": "cd" * 32}, "FAIL"),
    ({"resumed_from": "no resume line"}, "FAIL"),  # equal digests, but nothing was resumed
])
def test_the_resume_row_falls_a_grade_with_each_piece_of_evidence_spoiled(
        spoil: dict, grade: str) -> None:
    assert mp.resume_row(_evidence(**spoil))[1] == grade


def _gauntlet(**spoil: object) -> object:
    """A passing gauntlet of 5 repeats a side, its expectation stated, with `spoil` replaced
    (timing: "base"/"fast" lists of seconds per step; "expectation" the optimization's)."""
    from dataclasses import replace

    from parity.lab.runners import optimize as drv

    base = spoil.pop("base", [2.0, 2.1, 2.2, 2.05, 2.15])
    fast = spoil.pop("fast", [1.0, 1.1, 1.05, 1.2, 1.15])
    opt = drv.parse("autocast-bf16")
    opt = replace(opt, expectation=spoil.pop("expectation", opt.expectation))
    learned = drv.Learning(2.0, 0.1, 1.0)
    whole = {"opt": opt, "claims": [("amp.stand_in", 0.0, "<= 0", True)],
             "distance": {"loss": 0.0, "gradients": 0.0, "bitwise": 1.0},
             "timing": drv.Timing(base, fast, base, spoil.pop("wall_fast", fast), 1,
                                  spoil.pop("first", {})),
             "speedup": drv.speedup(np.array(base), np.array(fast)),
             "learning": {"baseline": learned, "optimized": learned},
             "resume": (0.0, 100, True)}
    return drv.Gauntlet(**{**whole, **spoil})  # type: ignore[arg-type]


_TEN = {"base": [2.0 + 0.01 * i for i in range(10)], "fast": [1.0 + 0.01 * i for i in range(10)]}
_FIRST = {"baseline": 0.01, "optimized": 0.02}


@pytest.mark.parametrize("criterion, spoil, grade", [
    ("optimization validity", {}, "Strong"),
    ("optimization validity", {"expectation": ""}, "Pass"),  # no expectation beside it
    ("optimization validity", {"speedup": (1.9, float("nan"), float("nan"))}, "Pass"),
    ("optimization validity", {"resume": (0.0, 100, False)}, "FAIL"),  # digest differs
    ("honest timing (optimization)", {}, "Pass"),  # 5 repeats, first calls not timed apart
    ("honest timing (optimization)", {**_TEN, "first": _FIRST}, "Strong"),
    ("honest timing (optimization)", _TEN, "Pass"),  # the first calls not timed apart
    ("honest timing (optimization)", {**_TEN, "first": {"baseline": 0.01}}, "Pass"),
    ("honest timing (optimization)", {**_TEN, "first": _FIRST,  # the wall clock disagrees
                                      "wall_fast": [2 * v for v in _TEN["fast"]]}, "Pass"),
    ("honest timing (optimization)", {"base": [2.0, 2.1], "fast": [1.0, 1.1]}, "FAIL"),
    ("honest timing (optimization)", {"fast": [1.0, 1.1, 1.05, 1.2]}, "FAIL"),  # unequal
    ("honest timing (optimization)", {"speedup": (1.9, 2.0, 2.1)}, "FAIL"),  # not around it
    ("honest timing (optimization)", {"fast": [1.0, 1.1, -1.0, 1.2, 1.15]}, "FAIL"),  # time < 0
])
def test_the_optimization_rows_fall_a_grade_with_each_piece_of_evidence_spoiled(
        criterion: str, spoil: dict, grade: str) -> None:
    rows = {r[0]: r for r in mp.optimization_rows(_gauntlet(**spoil), "optimize-x", "1.9")}
    assert rows[criterion][1] == grade, rows[criterion]


@pytest.mark.parametrize(("low", "high", "words"), [
    (0.9, 1.1, "a null result reported as null"), (0.19, 0.21, "a slowdown reported as one"),
    (1.2, 1.4, "a speedup reported as one"), (1.0, 1.3, "a null result reported as null")])
def test_the_timing_row_names_the_result_its_interval_gives(low: float, high: float,
                                                             words: str) -> None:
    """A slowdown (the whole interval below 1) is not called a null result."""
    assert mp._result_words(low, high) == words
