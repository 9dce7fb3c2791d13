"""The command line under a closed pipe and SIGTERM, through the real `python -m parity`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _piped_into_head(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """`python -m parity ARGS | head -1`: (the command's exit status, head's line, stderr)."""
    command = subprocess.Popen([sys.executable, "-m", "parity", *args], cwd=cwd, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.run(["head", "-1"], stdin=command.stdout, capture_output=True,
                          text=True, timeout=120)
    command.stdout.close()  # type: ignore[union-attr]  # head has gone: the pipe is closed
    err = command.stderr.read().decode()  # type: ignore[union-attr]
    command.stderr.close()  # type: ignore[union-attr]
    return command.wait(timeout=120), head.stdout, err


def test_a_table_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    status, line, err = _piped_into_head(["tolerances"], tmp_path)
    assert (status, line) == (0, "# Claims and tolerances\n")
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_a_training_run_piped_into_head_trains_and_checkpoints_to_the_end(tmp_path: Path
                                                                           ) -> None:
    """The reader going away loses the output, not the run: the last checkpoint is written."""
    run = tmp_path / "run"
    status, line, err = _piped_into_head(
        ["train", "--impl", "reference", "--steps", "40", "--checkpoint-dir", str(run),
         "--checkpoint-every", "10"], tmp_path)
    assert status == 0 and line.startswith("step 1 "), (status, line, err)
    assert "Traceback" not in err, err
    assert (run / "ckpt-00000040.ckpt").is_file(), sorted(p.name for p in run.iterdir())


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM is POSIX")
def test_sigterm_during_training_is_one_line_exit_143_and_the_run_resumes(tmp_path: Path
                                                                           ) -> None:
    run = tmp_path / "run"
    args = ["train", "--impl", "reference", "--steps", "100000", "--horizon", "100000",
            "--checkpoint-dir", str(run), "--checkpoint-every", "1"]
    p = subprocess.Popen([sys.executable, "-m", "parity", *args], cwd=tmp_path, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stdout:  # type: ignore[union-attr]
            if line.startswith("step 5 "):
                break
        time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143, err
    lines = err.strip().splitlines()
    assert lines == ["python -m parity train: terminated (SIGTERM)"], err
    assert not [q.name for q in run.iterdir() if not q.name.startswith("ckpt-")], (
        "a temporary file was left behind")
    newest = max(int(q.name[5:13]) for q in run.iterdir())  # ckpt-00000012.ckpt
    resumed = subprocess.run([sys.executable, "-m", "parity", *args[:3], "--steps",
                              str(newest + 2), *args[5:9], "--resume"],
                             cwd=tmp_path, env=ENV, capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from ckpt-{newest:08d}.ckpt at step {newest}" in resumed.stdout + (
        resumed.stderr)
    assert "state-sha256:" in resumed.stdout
