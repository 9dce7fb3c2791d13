"""A `python -m parity train --loader-workers 2` process SIGKILLed mid-run, then resumed
through the command line, reaches the digest of an uninterrupted run and of 0 workers
(train.kill_resume; NOTE [ Consumed position ] in reference/data.py). Its worker processes
end once their parent is gone (the DataLoader's watchdog); the test waits for them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from parity.compare import assert_claim
from parity.drivers.train import _ENV, KILL_OPTIONS, ROOT, cli, run_to_end
from torch_impl import resume as t_resume

STEPS = 40  # 16 batches an epoch: the kill and the prefetch cross epoch ends
WORKERS = ("--loader-workers", "2")


def _children(pid: int) -> list[int]:
    """The process ids whose parent is `pid` (Linux /proc)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with open(task / "children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def _gone(pids: list[int], timeout_s: float) -> bool:
    """True once none of `pids` is alive (a zombie counts as gone), within the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                continue
            if state != "Z":
                alive.append(pid)
        if not alive:
            return True
        time.sleep(0.1)
    return False


def _kill_after(directory: Path, after_file: str, delay: float) -> list[int]:
    """Start a resuming --loader-workers 2 process, SIGKILL it `delay` s after `after_file`
    appears; return the worker processes it had (asserting it had some)."""
    options = (*KILL_OPTIONS, *WORKERS)
    proc = subprocess.Popen(cli("torch", directory, STEPS, options), cwd=ROOT, env=_ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (directory / after_file).exists():
            assert proc.poll() is None, "the run ended before the kill"
            assert time.monotonic() < deadline, f"{after_file} never appeared"
            time.sleep(0.0005)
        workers = _children(proc.pid)  # at the file, before a step's time has passed
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    return workers


@pytest.mark.slow  # three training processes of ~8 s each
def test_sigkilled_loader_workers_run_resumes_to_the_digest_of_zero_workers(
        tmp_path: Path) -> None:
    """SIGKILL a `train --loader-workers 2` run mid-epoch (its workers had prefetched past
    the checkpoint, into the next epoch), then --resume with workers: the digest of an
    uninterrupted run with 2 workers, and of one with 0."""
    expected, lines = run_to_end("torch", tmp_path / "zero", STEPS, KILL_OPTIONS)
    with_workers, _ = run_to_end("torch", tmp_path / "two", STEPS, (*KILL_OPTIONS, *WORKERS))
    assert with_workers == expected, "an uninterrupted run with workers drifted from 0 workers"
    rng = np.random.default_rng()
    step = int(rng.integers(13, 16))  # 2 workers x prefetch 2 run 4 batches ahead: epoch 1
    # within a step (~4 ms on 2 cores): 30 ms once reached past the epoch's end, where the
    # epoch's workers had left and the next epoch's were not started yet
    workers = _kill_after(tmp_path / "killed", f"ckpt-{step:08d}.ckpt",
                          float(rng.uniform(0.0, 0.002)))
    try:
        assert len(workers) >= 2, f"guard: the killed run had worker processes ({workers})"
    finally:
        assert _gone(workers, 60.0), f"worker processes {workers} outlived their parent"
    for _, path in t_resume.CheckpointManager(tmp_path / "killed").checkpoints():
        t_resume.load_checkpoint(path)  # every file under a checkpoint name loads
    done = subprocess.run(cli("torch", tmp_path / "killed", STEPS, (*KILL_OPTIONS, *WORKERS)),
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=True,
                          env=_ENV)
    # the directory's notices (a partly written file the kill left, then the resume line) go
    # to stderr; the step lines and the digest to stdout
    notices = done.stderr.splitlines()
    assert any(line.startswith("resumed from ckpt-") for line in notices), notices[:3]
    resumed = done.stdout.strip().splitlines()
    assert lines[-1] == resumed[-1]
    actual = resumed[-1].removeprefix("state-sha256: ")
    assert_claim("train.kill_resume", actual=np.frombuffer(bytes.fromhex(actual), np.uint8),
                 expected=np.frombuffer(bytes.fromhex(expected), np.uint8))
