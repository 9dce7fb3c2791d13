"""The course's mini-project, assembled from the pieces this project builds.

    the prediction sheet and synchronized profile   parity/lab/cli/profile.py
    one fault postmortem                             fp16 without loss scaling (below)
    the optimization report                          parity/lab/runners/optimize.py
    the interrupted-and-resumed run                  a training process SIGKILLed while it
                                                     commits a checkpoint (below)

A piece whose command is not part of this checkout is reported as missing, never faked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

# ---------------------------------------------------------------- resume: kill mid-commit

RESUME_STEPS, KILL_AT = 30, 20
RESUME_OPTIONS = ("--checkpoint-every", "5", "--keep", "3", "--precision", "fp16",
                  "--dropout", "0.1", "--seed", "7")
PAUSED = "PAUSED-BEFORE-RENAME"


def paused_train(argv: list[str], pause_name: str) -> int:
    """`python -m parity train argv`, except that the commit of the checkpoint file named
    `pause_name` stops just before its rename: the temporary file is written and fsynced,
    the final name not yet replaced. The process prints PAUSED and sleeps, to be killed.

    This makes "killed while committing a checkpoint" a moment the parent can hit every time
    instead of a race; what the kill then leaves on disk is exactly what an unlucky SIGKILL
    at that instant leaves.
    """
    from parity.lab.cli import main

    real_replace = os.replace

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        if Path(dst).name == pause_name:
            print(PAUSED, flush=True)
            while True:
                time.sleep(60)
        real_replace(src, dst, **kwargs)

    os.replace = replace  # type: ignore[assignment]
    return main(["train", *argv])


@dataclass
class ResumeEvidence:
    killed: bool
    leftover_temp: list[str]
    before_kill: list[str]  # checkpoint names present when the commit started
    survivors: list[str]  # checkpoint names after the kill, each verified by loading it
    resumed_from: str
    digest_resumed: str
    digest_uninterrupted: str

    @property
    def exact(self) -> bool:
        return self.digest_resumed == self.digest_uninterrupted


def _train(directory: Path, steps: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "parity", "train", "--impl", "torch",
                           "--steps", str(steps), "--checkpoint-dir", str(directory),
                           *RESUME_OPTIONS, *extra], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=_ENV, check=True)


def _digest(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout.strip().splitlines()[-1].removeprefix("state-sha256: ")


def resume_evidence(work: Path) -> ResumeEvidence:
    """Kill a training process while it commits the checkpoint of step KILL_AT, show every
    surviving checkpoint loads, resume, compare the digest with an uninterrupted run."""
    from torch_impl import resume

    expected = _digest(_train(work / "uninterrupted", RESUME_STEPS))
    directory = work / "killed"
    target = f"ckpt-{KILL_AT:08d}.ckpt"
    argv = ["--impl", "torch", "--steps", str(RESUME_STEPS), "--checkpoint-dir",
            str(directory), *RESUME_OPTIONS]
    code = ("import sys; from parity.lab.runners.miniproject import paused_train; "
            f"sys.exit(paused_train({argv!r}, {target!r}))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=_ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    killed = False
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.strip() == PAUSED:
                before = sorted(p.name for p in directory.glob("ckpt-*.ckpt"))
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
                break
    finally:
        if proc.poll() is None and not killed:
            proc.kill()
        proc.wait(timeout=60)
        proc.stdout.close()  # type: ignore[union-attr]
    if not killed:
        raise RuntimeError("the training process finished before committing "
                           f"{target}: nothing was killed")
    leftover = sorted(p.name for p in directory.glob(".*.tmp"))
    survivors = []
    for _, path in resume.CheckpointManager(directory).checkpoints():
        resume.load_checkpoint(path)  # raises if the kill damaged it
        survivors.append(path.name)
    done = _train(directory, RESUME_STEPS, "--resume")
    resumed_from = next((ln for ln in done.stdout.splitlines() if ln.startswith("resumed")),
                        "no resume line")
    return ResumeEvidence(killed, leftover, before, survivors, resumed_from, _digest(done),
                          expected)


# ---------------------------------------------------------------- prediction before measurement

SHEET = ("predictions.json", "predictions.md")


def sheet_first(folder: Path) -> tuple[bool, str]:
    """(whether both files of the prediction sheet were written no later than every other
    file in `folder`, the reason in words). A missing sheet file fails; so does any
    measurement file (profile.json, profile.md, trace.json, the pictures) older than either
    sheet file. Modification times in nanoseconds, as the profile run left them."""
    missing = [name for name in SHEET if not (folder / name).is_file()]
    if missing:
        return False, f"no {' and no '.join(missing)} in {folder.name}/"
    sheet = max((folder / name).stat().st_mtime_ns for name in SHEET)
    measured = sorted((p.stat().st_mtime_ns, p.name) for p in folder.iterdir()
                      if p.is_file() and p.name not in SHEET)
    if not measured:
        return False, f"no measurement file in {folder.name}/ after the sheet"
    first, name = measured[0]
    if first < sheet:
        return False, f"{name} is older than the prediction sheet"
    return True, (f"predictions.json and predictions.md were written before every one of "
                  f"the {len(measured)} measurement files (first: {name})")


# ---------------------------------------------------------------- fault postmortem

@dataclass
class Postmortem:
    """fp16 training without loss scaling, investigated: per-layer measurements that tell
    the hypotheses apart, the repair, and a guard that fails before it and passes after."""

    zeros: dict[str, dict[str, float]]  # "fp16, S=1" | "fp16, S=2^16" | "fp32" -> name -> share
    error: dict[str, dict[str, float]]  # relative error against float32, same keys but fp32
    forward_max: float  # largest |activation| of the fp16 forward
    forward_nonfinite: int
    guard_before: bool
    guard_after: bool
    notes: list[str] = field(default_factory=list)


FP16_MAX = 65504.0


def guard_no_underflow(zeros_fp16: dict[str, float], zeros_fp32: dict[str, float]) -> bool:
    """The regression guard: no parameter's gradient has more exact zeros in fp16 than the
    same gradient in float32 (an underflow to 0 is the only way to gain one)."""
    return all(zeros_fp16[name] <= zeros_fp32[name] for name in zeros_fp32)


def postmortem() -> Postmortem:
    """Measure the fault with the loss-scaling topic's small-init model and batch."""
    import torch

    from parity.drivers.loss_scaling import underflow_batch, underflow_grads, underflow_models

    runs = {"fp16, S=1": underflow_grads(1.0), "fp16, S=2^16": underflow_grads(2.0**16)}
    _, tm = underflow_models()
    x, y = underflow_batch()
    tm.zero_grad()
    loss = torch.nn.functional.mse_loss(tm(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    fp32 = {name: p.grad.numpy().astype(np.float64) for name, p in tm.named_parameters()}
    zeros = {key: {name: float(np.mean(t == 0)) for name, _, t in grads}
             for key, grads in runs.items()}
    zeros["fp32"] = {name: float(np.mean(g == 0)) for name, g in fp32.items()}
    error = {key: {name: float(np.linalg.norm(t.astype(np.float64) - fp32[name])
                               / np.linalg.norm(fp32[name])) for name, _, t in grads}
             for key, grads in runs.items()}
    # H2 (overflow in forward): the largest activation under fp16 autocast, and non-finites
    peaks: list[float] = []
    bad = 0

    def hook(_m: Any, _i: Any, out: torch.Tensor) -> None:
        nonlocal bad
        peaks.append(float(out.detach().abs().max()))
        bad += int((~torch.isfinite(out)).sum())

    handles = [m.register_forward_hook(hook) for m in tm]
    with torch.autocast("cpu", dtype=torch.float16):
        tm(torch.from_numpy(x))
    for h in handles:
        h.remove()
    return Postmortem(zeros, error, max(peaks), bad,
                      guard_before=guard_no_underflow(zeros["fp16, S=1"], zeros["fp32"]),
                      guard_after=guard_no_underflow(zeros["fp16, S=2^16"], zeros["fp32"]))
