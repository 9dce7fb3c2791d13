"""`train --check-numerics` and `--fault-step` as a user runs them (the command's main): a
second run that stops at the same step keeps the first run's replay file (NOTE [ A replay
file replaces nothing ] in parity/lab/runners/replay_file.py), and --fault-step K means what
its help says: the fault is seeded after K steps, so the line `step K+1` is the first to
show it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from parity.lab.cli import EXIT_FOUND, main
from tests.test_cli import assert_one_line_error

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m parity train --impl reference ARGS` in `cwd`, through the command's own
    main in this process (a subprocess each paid ~1.5 s of imports: the command line as a
    process is tests/test_cli_paths.py's and the --help run's below)."""
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["train", "--impl", "reference", *args])
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["train", *args], status, out.getvalue(),
                                       err.getvalue())


def test_a_second_run_keeps_the_first_runs_replay_and_says_where_its_own_went(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = ["--steps", "4", "--checkpoint-dir", "run", "--check-numerics", "--fault",
           "inf_weight", "--fault-step", "2"]
    first = _train(run, tmp_path)
    assert first.returncode == 3, first.stderr
    kept = tmp_path / "run" / "first-invalid-step2.replay"
    before = (kept.stat().st_ino, kept.read_bytes())
    second = _train(run, tmp_path)
    assert second.returncode == 3, second.stderr
    assert (kept.stat().st_ino, kept.read_bytes()) == before  # the same file, untouched
    written = tmp_path / "run" / "first-invalid-step2-2.replay"
    assert written.read_bytes() == before[1]  # the same deterministic run, its own file
    assert second.stderr.strip().splitlines() == [
        "train: first-invalid-step2.replay in run is an earlier run's and is kept; "
        "this run's replay is first-invalid-step2-2.replay"], second.stderr
    assert f"replay: python -m parity replay {Path('run') / written.name} --impl reference" in (
        second.stdout)
    # the file it named replays (in this process: the replay command's own subprocess runs
    # are docs/numerics.md's)
    status = main(["replay", str(written), "--impl", "reference"])
    out, err = capsys.readouterr()
    assert status == EXIT_FOUND and "replay-node:" in out, err


def test_a_users_file_of_the_replays_name_is_left_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    mine = tmp_path / "run" / "first-invalid-step1.replay"
    mine.write_text("my notes\n")
    done = _train(["--steps", "3", "--checkpoint-dir", "run", "--check-numerics", "--fault",
                   "inf_weight", "--fault-step", "1", "--quiet"], tmp_path)
    assert done.returncode == 3, done.stderr
    assert mine.read_text() == "my notes\n"
    assert (tmp_path / "run" / "first-invalid-step1-2.replay").stat().st_size > 0


def _over_max(line: str) -> int:
    """The activations' over_max count of a --check-numerics step line (act a/b/c/d/e/f)."""
    return int(re.search(r"act (\d+)/(\d+)/(\d+)/(\d+)/(\d+)/(\d+)", line).group(5))  # type: ignore[union-attr]


def test_fault_step_k_is_seeded_after_k_steps_as_its_help_says(tmp_path: Path) -> None:
    """weight_overflow after 1 step: the line `step 1` is clean, `step 2` the first whose
    activations exceed the format's max; inf_weight after 1 step stops in the step printed as
    `step 2`, which the first-invalid report numbers 1 (from 0), as the help says."""
    helped = subprocess.run([sys.executable, "-m", "parity", "train", "--help"], cwd=tmp_path,
                            env=ENV, capture_output=True, text=True, timeout=120)
    flat = " ".join(helped.stdout.split())
    assert "seed --fault after K steps: the step printed as 'step K+1' is the first with it" in (
        flat)
    assert "numbers steps from 0: it names that step K" in flat
    overflow = _train(["--steps", "3", "--checkpoint-dir", "a", "--check-numerics", "--fault",
                       "weight_overflow", "--fault-step", "1"], tmp_path)
    lines = [ln for ln in overflow.stdout.splitlines() if ln.startswith("step ")]
    assert [ln.split()[1] for ln in lines] == ["1", "2", "3"], overflow.stdout
    assert _over_max(lines[0]) == 0 and _over_max(lines[1]) > 0, lines
    stopped = _train(["--steps", "3", "--checkpoint-dir", "b", "--check-numerics", "--fault",
                      "inf_weight", "--fault-step", "1"], tmp_path)
    assert stopped.returncode == 3, stopped.stderr
    assert [ln.split()[1] for ln in stopped.stdout.splitlines() if ln.startswith("step ")] == [
        "1"]
    report = json.loads(stopped.stdout.strip().splitlines()[-1].removeprefix("first-invalid: "))
    assert report["step"] == 1


def test_a_fault_step_past_the_last_step_names_the_steps_as_they_print(tmp_path: Path
                                                                       ) -> None:
    done = _train(["--steps", "3", "--checkpoint-dir", "run", "--fault", "inf_weight",
                   "--fault-step", "3"], tmp_path)
    assert_one_line_error(done.returncode, done.stderr, "--fault-step 3", "after 3 steps",
                          "before the line 'step 4'", "ends at 'step 3'", "never strike",
                          "accepted: 0 to 2")
    assert not (tmp_path / "run").exists()
