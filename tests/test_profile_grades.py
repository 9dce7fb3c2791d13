"""The mini-project's profile rows (parity/lab/runners/profile_grades.py): each grade falls
when one piece of its evidence is spoiled, and the real profile earns its grades."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from parity.drivers import profile_async as pasync
from parity.drivers import profile_gaps as gaps
from parity.lab.runners import profile_grades as grades

ROOT = Path(__file__).resolve().parent.parent


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
    ([".mirrortrain-output", "predictions.json", "predictions.md", "profile.json"], True),
    ([".mirrortrain-output", "predictions.json", "predictions.md"], False),  # a mark only
])
def test_the_sheet_counts_as_first_only_if_both_its_files_precede_every_measurement(
        tmp_path: Path, order: list[str], first: bool) -> None:
    _files(tmp_path / "profile", order)
    ok, why = grades.sheet_first(tmp_path / "profile")
    assert ok is first, why


_PHASES = {"data wait": 1e-4, "forward": 2e-4, "backward": 3e-4, "optimizer": 1e-4}


def _step(**over: float) -> dict[str, float]:
    phases = {**_PHASES, "host-to-device": 1e-5, **over}
    return {**phases, "step": sum(phases.values()) + 5e-5, "outside the phases": 5e-5}


def _worker(moved: bool) -> dict[str, Any]:
    """Eight steps per loop, +-5% around their centre; the wait (4 ms) in the data wait of
    the first loop and, when `moved`, in the optimizer of the second."""
    jitter = [0.95, 1.0, 1.05, 0.97, 1.03, 0.99, 1.01, 1.02]
    a = [_step(**{"data wait": 4e-3 * j}) for j in jitter]
    b = [_step(optimizer=4e-3 * j) if moved else _step(**{"data wait": 4e-3 * j})
         for j in jitter]
    return {"latency_s": 5e-3, "steps": {pasync.IN_DATA_WAIT: a, pasync.IN_OPTIMIZER: b}}


def _time_row(phase: str, verdict: str = "explained") -> dict[str, Any]:
    return {"phase": phase, "predicted": 1e-6, "measured": {"median": _PHASES.get(phase, 7e-4)},
            "terms": [{"term": "Python overhead per op", "seconds": 9e-5}], "verdict": verdict}


def _profile(folder: Path, **spoil: Any) -> None:
    """A profile folder earning Strong on both rows, with `spoil` applied: "sheet" (the
    sheet's fields replaced), "sha" (another sheet compared), "verdict" (the forward's),
    "term" (the forward's term size), "memory" (UNEXPLAINED byte rows), "worker" (its
    record, or None), "steps" (the synchronized steps), "order" (files written in order)."""
    _files(folder, spoil.get("order", ["predictions.json", "predictions.md", "profile.json"]))
    sheet = {"seconds": {"data wait": 1e-7, "host-to-device": 0.0, "forward": 4e-7,
                         "backward": 8e-7, "optimizer": 2e-6}, "slowest": "optimizer",
             **spoil.get("sheet", {})}
    body = json.dumps(sheet).encode()
    rows = [_time_row(p) for p in ("data wait", "host-to-device", "forward", "backward",
                                   "optimizer", gaps.OUTSIDE)] + [_time_row("step", "")]
    rows[2]["verdict"] = spoil.get("verdict", "explained")
    rows[2]["terms"][0]["seconds"] = spoil.get("term", 9e-5)
    record = {"predictions": {"sha256": spoil.get("sha", hashlib.sha256(body).hexdigest())},
              "sheet": sheet,
              "comparison": {"time": rows, "unexplained": {
                  "time": sum(r["verdict"].startswith(gaps.UNEXPLAINED) for r in rows),
                  "memory": spoil.get("memory", 0)}},
              "measured": {"honest": {"synchronized": spoil.get("steps", [_step()] * 3)},
                           "worker": spoil.get("worker", _worker(True))}}
    for name, text in (("predictions.json", body), ("profile.json",
                                                     json.dumps(record).encode())):
        if (folder / name).exists():
            stamp = (folder / name).stat().st_mtime_ns
            (folder / name).write_bytes(text)
            os.utime(folder / name, ns=(stamp, stamp))


PREDICTION, HONEST = "prediction before measurement", "honest timing (profile)"


@pytest.mark.parametrize("criterion, spoil, grade", [
    (PREDICTION, {}, "Strong"),
    (PREDICTION, {"returncode": 1}, "FAIL"),
    (PREDICTION, {"order": ["predictions.json", "profile.json", "predictions.md"]}, "FAIL"),
    (PREDICTION, {"sha": "0" * 64}, "FAIL"),  # compared with another sheet
    (PREDICTION, {"sheet": {"slowest": None}}, "FAIL"),  # no slowest predicted
    (PREDICTION, {"sheet": {"seconds": {"forward": 1e-6}}}, "FAIL"),  # a phase unpredicted
    (PREDICTION, {"verdict": f"{gaps.UNEXPLAINED} (terms cover 40% of the gap)"}, "Pass"),
    (PREDICTION, {"memory": 2}, "Pass"),
    (PREDICTION, {"term": float("nan")}, "Pass"),  # a term of no measured size
    (HONEST, {}, "Strong"),
    (HONEST, {"returncode": 1}, "FAIL"),
    (HONEST, {"steps": []}, "FAIL"),  # nothing timed
    (HONEST, {"steps": [{k: v for k, v in _step().items() if k != "data wait"}]}, "FAIL"),
    (HONEST, {"worker": None}, "Pass"),  # no timing shown to move
    (HONEST, {"worker": _worker(False)}, "Pass"),  # the wait stayed in the data wait
])
def test_the_profile_rows_fall_a_grade_with_each_piece_of_evidence_spoiled(
        tmp_path: Path, criterion: str, spoil: dict, grade: str) -> None:
    folder = tmp_path / "profile"
    _profile(folder, **spoil)
    rows = {r[0]: r for r in grades.profile_rows(folder, spoil.get("returncode", 0))}
    assert rows[criterion][1] == grade, rows[criterion]


def test_a_wait_that_moves_by_less_than_the_spread_has_not_moved(tmp_path: Path) -> None:
    """Each phase's first quartile must clear the other loop's third, not just its median:
    the data wait has moved out, but the optimizer is only 2% up inside its +-5% jitter."""
    jitter = (0.95, 1.0, 1.05, 0.97, 1.03, 0.99, 1.01, 1.02)
    worker = _worker(True)
    worker["steps"][pasync.IN_DATA_WAIT] = [_step(**{"data wait": 4e-3 * j, "optimizer": 1e-4 * j})
                                            for j in jitter]
    worker["steps"][pasync.IN_OPTIMIZER] = [_step(optimizer=1.02e-4 * j) for j in jitter]
    _profile(tmp_path, worker=worker)
    assert grades.honest_row(tmp_path)[1] == "Pass"


@pytest.mark.slow
def test_the_real_profile_writes_the_sheet_first_and_moves_the_workers_wait(
        tmp_path: Path) -> None:
    """The real `python -m parity profile` run the mini-project makes: predictions.json and
    predictions.md are older than every measurement file, and the loader worker's wait
    moves from the data wait into the optimizer (NOTE [ A sync on the CPU ])."""
    done = subprocess.run([sys.executable, "-m", "parity", "profile", "--impl", "torch",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert len([p for p in tmp_path.iterdir() if p.name not in grades.SHEET]) >= 3
    ok, why = grades.sheet_first(tmp_path)
    assert ok, why
    row = grades.honest_row(tmp_path)
    assert row[1] == "Strong", row
    assert grades.prediction_row(tmp_path)[1] in ("Pass", "Strong")
