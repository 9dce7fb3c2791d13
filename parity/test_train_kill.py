"""Real processes killed with SIGKILL resume to the same digest (train.kill_resume): the
command line `python -m parity train` run to the end once, then killed at chosen and random
moments (right after a skipped fp16 step's checkpoint lands, mid-write) and resumed with
--resume; every checkpoint left behind loads. Drivers: parity/drivers/train.py. The
in-process resume tests are parity/test_train.py.
"""

from __future__ import annotations

import contextlib
import io
import itertools
from pathlib import Path

import numpy as np
import pytest

from parity.compare import assert_claim
from parity.drivers.train import (
    GPT_KILL_OPTIONS,
    KILL_OPTIONS,
    cli,
    kill_at,
    run_to_end,
    skipped_steps,
)
from parity.lab.cli import main
from reference import resume as ref_resume
from torch_impl import resume as t_resume


def _run_to_end_in_process(name: str, directory: Path, steps: int, options: tuple[str, ...]
                           ) -> tuple[str, list[str]]:
    """run_to_end's (digest, output lines), from the same command line run by parity.lab.cli.main
    in this process (one thread, as the processes run): only the run that is killed needs a
    process of its own; the uninterrupted run and the final --resume (which reads what the
    killed process left) need not pay for starting one (~2 s each)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(cli(name, directory, steps, options)[3:])  # after "python -m parity"
    lines = out.getvalue().strip().splitlines()
    assert status == 0 and lines[-1].startswith("state-sha256: "), lines[-3:]
    return lines[-1].removeprefix("state-sha256: "), lines


def _kill_and_resume(name: str, tmp: Path, steps: int, delays: list[float],
                     targeted: int | None, moments: int = 0, device: str = "cpu",
                     kill_options: tuple[str, ...] = KILL_OPTIONS, in_process: bool = False
                     ) -> int:
    """Uninterrupted digest; kills (targeted first, then `delays` seconds after start, then
    `moments` kills at random moments after the targeted one); every checkpoint loads after
    each kill; the final --resume prints the uninterrupted digest. Returns the number of
    kills. `in_process`: the uninterrupted run and the final --resume run in this process."""
    options = kill_options + (("--device", device) if name == "torch" else ())
    run = _run_to_end_in_process if in_process else run_to_end
    expected, lines = run(name, tmp / "uninterrupted", steps, options)
    skipped = skipped_steps(lines)
    assert skipped, "guard: the fp16 options must produce skipped steps"
    directory = tmp / "killed"
    kills = 0
    plan: list[tuple[float | None, str | None]] = [(d, None) for d in delays]
    if targeted is not None:  # kill right after the checkpoint of a skipped step lands
        plan.insert(0, (None, f"ckpt-{skipped[targeted]:08d}.ckpt"))
    if moments:
        # Random moments a fast machine cannot outrun: increasing steps at least ~30 apart
        # (each killed process resumes past the previous kill, and --keep deletes old files),
        # then a random 0-30 ms into what follows that step's checkpoint (usually the next
        # step and its checkpoint write).
        rng = np.random.default_rng()
        first = (skipped[targeted] if targeted is not None else 0) + 5
        grid = np.linspace(first, steps - 10, moments + 1)
        for lo, hi in itertools.pairwise(grid):
            step = int(rng.integers(int(lo), int(lo + (hi - lo) / 2) + 1))
            plan.append((float(rng.uniform(0.0, 0.03)), f"ckpt-{step:08d}.ckpt"))
    for delay, after in plan:
        kills += kill_at(name, directory, steps, options, delay=delay, after_file=after)
        mod = ref_resume if name == "reference" else t_resume
        for _, path in mod.CheckpointManager(directory).checkpoints():
            mod.load_checkpoint(path)  # every file under a checkpoint name loads
    assert kills >= 1
    actual, _ = run(name, directory, steps, options)
    assert_claim("train.kill_resume", actual=np.frombuffer(bytes.fromhex(actual), np.uint8),
                 expected=np.frombuffer(bytes.fromhex(expected), np.uint8))
    return kills


@pytest.mark.slow  # the default run kills a torch process; in-process resume covers both trees
def test_sigkilled_reference_process_resumes_to_the_same_digest(tmp_path: Path) -> None:
    """A handful of SIGKILLs (one right after a skipped step) then --resume: the same digest."""
    rng = np.random.default_rng()
    _kill_and_resume("reference", tmp_path, 100, sorted(rng.uniform(0.3, 0.6, 3)), targeted=0)


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
def test_sigkilled_torch_process_resumes_to_the_same_digest(tmp_path: Path, device: str) -> None:
    """One SIGKILL right after a skipped fp16 step's checkpoint (the second skipped step, 6
    of 12), then --resume from what the killed process left: the digest of the run that was
    not interrupted."""
    _kill_and_resume("torch", tmp_path, 12, [], targeted=1, device=device, in_process=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reference", "torch"])
def test_many_sigkills_at_random_moments_resume_to_the_same_digest(name: str, tmp_path: Path,
                                                                   device: str) -> None:
    """Dozens of SIGKILLs at random moments during a run that checkpoints every step."""
    steps, count = (1500, 40) if name == "reference" else (400, 12)
    kills = _kill_and_resume(name, tmp_path, steps, [], targeted=2, moments=count,
                             device=device)
    assert kills >= (count + 1) // 2


@pytest.mark.slow  # ~10 s; the in-process gpt resume tests run by default
def test_sigkilled_gpt_process_resumes_to_the_same_digest(tmp_path: Path) -> None:
    """The transformer, fp16 with skipped steps, every block and core recomputed: one SIGKILL
    right after a skipped step's checkpoint, another at a random moment, then --resume."""
    rng = np.random.default_rng()  # ~1.8 s of start-up, then ~0.07 s a step: mid-run
    _kill_and_resume("reference", tmp_path, 20, [float(rng.uniform(1.9, 2.4))], targeted=0,
                     kill_options=GPT_KILL_OPTIONS)


GPT_MATRIX = [(precision, recompute) for precision in ("fp32", "bf16", "fp16")
              for recompute in ("none", "sqrt", "selective", "optimal:2+selective")]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reference", "torch"])
@pytest.mark.parametrize(("precision", "recompute"), GPT_MATRIX)
def test_sigkilled_gpt_processes_resume_to_the_same_digest_in_every_option(
        name: str, precision: str, recompute: str, tmp_path: Path, device: str) -> None:
    """Every precision and recompute option of --model gpt, SIGKILLed at random moments of a
    run that checkpoints every step: --resume reaches the uninterrupted digest."""
    options = ("--model", "gpt", "--checkpoint-every", "1", "--keep", "2", "--dropout", "0.1",
               "--precision", precision, "--recompute", recompute,
               *(("--init-scale", "262144", "--growth-interval", "3")
                 if precision == "fp16" else ()))
    if precision == "fp16":
        kills = _kill_and_resume(name, tmp_path, 60, [], targeted=1, moments=3, device=device,
                                 kill_options=options)
    else:  # no skipped steps to aim at: kill at random moments
        kills = _kill_and_resume_at_moments(name, tmp_path, 60, options, device)
    assert kills >= 1


def _kill_and_resume_at_moments(name: str, tmp: Path, steps: int, options: tuple[str, ...],
                                device: str) -> int:
    options = options + (("--device", device) if name == "torch" else ())
    expected, _ = run_to_end(name, tmp / "uninterrupted", steps, options)
    rng = np.random.default_rng()
    kills = 0
    for step in sorted(rng.choice(np.arange(5, steps - 5), 3, replace=False)):
        kills += kill_at(name, tmp / "killed", steps, options,
                         delay=float(rng.uniform(0.0, 0.03)), after_file=f"ckpt-{step:08d}.ckpt")
    actual, _ = run_to_end(name, tmp / "killed", steps, options)
    assert_claim("train.kill_resume", actual=np.frombuffer(bytes.fromhex(actual), np.uint8),
                 expected=np.frombuffer(bytes.fromhex(expected), np.uint8))
    return kills
