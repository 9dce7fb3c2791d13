"""`python -m parity train --quiet` as a script sees it (a real subprocess): stdout holds the
digest and nothing else, whatever the resume found; what the directory policy says goes to
stderr; --resume-strict refuses when there is nothing to resume; a refused run leaves no
folder it created behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from parity.lab.cli import EXIT_OK, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[1]


def _train(directory: Path, *argv: str, impl: str = "reference"
           ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "parity", "train", "--impl", impl,
                           "--steps", "4", "--horizon", "4", "--checkpoint-every", "2",
                           "--checkpoint-dir",
                           str(directory), "--quiet", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _only_the_digest(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == EXIT_OK, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("state-sha256: "), done.stdout
    return lines[0]


def test_a_quiet_resume_with_nothing_to_resume_says_so_on_stderr(tmp_path: Path) -> None:
    """--resume into a mistyped (missing) directory: the digest on stdout, the notice on
    stderr."""
    done = _train(tmp_path / "mistyped", "--resume")
    _only_the_digest(done)
    assert f"nothing to resume in {tmp_path / 'mistyped'}" in done.stderr


@pytest.mark.parametrize("where", ["missing", pytest.param("empty", marks=pytest.mark.slow)])
def test_resume_strict_with_nothing_to_resume_is_refused_in_one_line(
        tmp_path: Path, where: str) -> None:
    """--resume-strict into a missing or empty directory: exit 2, one line on stderr, nothing
    on stdout, and a missing directory is still missing."""
    directory = tmp_path / "ckpt"
    if where == "empty":
        directory.mkdir()
    done = _train(directory, "--resume-strict")
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "nothing to resume in" in done.stderr
    assert directory.exists() == (where == "empty")
    assert list(tmp_path.iterdir()) == ([directory] if where == "empty" else [])


@pytest.mark.slow
def test_resume_strict_resumes_where_there_is_a_checkpoint(tmp_path: Path) -> None:
    """--resume-strict is --resume where there is something to resume: 2 steps, then 4,
    ends on the digest of 4 steps in one run."""
    _only_the_digest(_train(tmp_path / "a", "--steps", "2"))
    resumed = _train(tmp_path / "a", "--resume-strict")
    assert _only_the_digest(resumed) == _only_the_digest(_train(tmp_path / "b"))
    assert "resumed from ckpt-00000002.ckpt at step 2" in resumed.stderr


def test_a_quiet_resume_past_a_corrupt_newest_checkpoint_says_so_on_stderr(
        tmp_path: Path) -> None:
    """The newest checkpoint damaged: skipped for the older one, reported on stderr only."""
    expected = _only_the_digest(_train(tmp_path))
    newest = tmp_path / "ckpt-00000004.ckpt"
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0x01
    newest.write_bytes(bytes(data))
    done = _train(tmp_path, "--resume")
    assert _only_the_digest(done) == expected
    assert "skipped ckpt-00000004.ckpt" in done.stderr
    assert "resumed from ckpt-00000002.ckpt at step 2" in done.stderr


@pytest.mark.slow
def test_a_quiet_resume_of_the_other_implementations_checkpoint_says_so_on_stderr(
        tmp_path: Path) -> None:
    """A reference checkpoint continued by --impl torch: converted, and stderr says so."""
    _only_the_digest(_train(tmp_path, "--steps", "2"))
    done = _train(tmp_path, "--resume", impl="torch")
    _only_the_digest(done)
    assert "resumed from ckpt-00000002.ckpt at step 2 (written by " in done.stderr
    assert "converted" in done.stderr


@pytest.mark.parametrize("argv", [["--resume", "--overwrite"],
                                  ["--fault", "inf_weight", "--fault-step", "9"]])
def test_a_refused_run_leaves_no_directory_it_created(tmp_path: Path,
                                                      argv: list[str]) -> None:
    """Refusals made once the directory is opened (the policy's, a fault that would never
    strike) leave neither the directory nor its missing parent."""
    done = _train(tmp_path / "a" / "ckpt", *argv)
    assert done.returncode == EXIT_USAGE and len(done.stderr.splitlines()) == 1, done.stderr
    assert list(tmp_path.iterdir()) == []
