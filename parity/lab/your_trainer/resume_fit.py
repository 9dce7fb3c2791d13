"""Resume equivalence of a loop a framework owns (transformers' Trainer.train(), Lightning's
fit): the framework trains and saves; a callback the project provides (callbacks.py,
callbacks_lightning.py) records what resume-check needs.

The user's adapter is a function that takes a FitRun and trains with the callback in it:

    def fit(run):                                   # module:function, e.g. mytrain:fit
        trainer = Trainer(model=make_model(), train_dataset=data(), callbacks=[
            ResumeCheckCallback(run)], args=TrainingArguments(run.dir, max_steps=run.steps))
        trainer.train(resume_from_checkpoint=run.resume_from)

What check_fit does:
  1. in this process, the straight run: fit(run) with resume_from None. After each optimizer
     step t the callback digests the framework's state (model, optimizers, schedulers,
     global step; callbacks.py says which for each client) and the global generators
     (NOTE [ Observed beside the state ] in resume_state.py), and once more as step
     at + 1 begins. At t = at it asks the
     framework to save, by its own means (Trainer's checkpoint-<at> folder, with the user's
     TrainingArguments; Lightning's trainer.save_checkpoint), and at t = steps to stop.
  2. a fresh process: fit(run) with resume_from that checkpoint, so the framework's own
     resume loads it; the digests as step at + 1 begins (what the load restored), after
     each step t > at, and the final state.
  3. the verdict, as the factory mode's (resume_check.py): the final states entry by entry,
     and the first step whose digests differ (t = at: as step at + 1 begins, right after
     the load).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from parity.lab.your_trainer.resume_check import (
    ResumeCheckError,
    ResumeReport,
    TrainerFailed,
    child_process,
    compare_final,
    parted,
)
from parity.lab.your_trainer.resume_state import check_storable, digests, flatten, global_rngs
from parity.lab.your_trainer.resume_worker import load_factory

__all__ = ["FitRun", "check_fit"]

CHILD = ("import sys; del sys.path[0]; "
         "from parity.lab.your_trainer.resume_fit import main; main()")
TIMEOUT = 600.0  # seconds the resumed run may take
Fit = Callable[["FitRun"], Any] | str  # the user's fit, or its "module:function" path


@dataclass
class FitRun:
    """What resume-check asks of one run of the user's fit, and what the callback records.
    `dir`: an empty folder for this run's outputs (Trainer's output_dir, Lightning's
    default_root_dir); `resume_from`: the checkpoint the framework resumes from (None: the
    straight run); `steps`: where the run stops (max_steps); `at`: the step saved."""

    steps: int
    at: int
    dir: str
    resume_from: str | None = None
    trail: dict[int, dict[str, dict[str, str]]] = field(default_factory=dict)
    loaded: dict[str, dict[str, str]] | None = None  # before step at + 1 (after the load)
    final: dict[str, Any] | None = None
    checkpoint: str | None = None  # where the straight run's framework saved step `at`

    def should_save(self, step: int) -> bool:
        """The callback asks its framework to save now (the straight run, at step `at`)."""
        return self.resume_from is None and step == self.at

    def record(self, step: int, state: Mapping[str, Any]) -> None:
        """The digests of the framework's state and of the global generators after `step`."""
        check_storable(state)
        self.trail[step] = {"state": digests(flatten(state)),
                            "observed": digests(global_rngs())}

    def before(self, step: int, state: Mapping[str, Any]) -> None:
        """The digests as step `step` + 1 begins, kept once, at `at`: in the resumed run,
        what the framework's load restored."""
        if step == self.at and self.loaded is None:
            check_storable(state)
            self.loaded = {"state": digests(flatten(state)), "observed": digests(global_rngs())}

    def saved(self, path: str | os.PathLike) -> None:
        self.checkpoint = str(path)

    def finish(self, state: Mapping[str, Any]) -> None:
        """The final state, copied (the framework's tensors live on)."""
        check_storable(state)
        self.final = {name: v.detach().clone() if isinstance(v, torch.Tensor) else v
                      for name, v in flatten(state).items()}


def _fit(path: Fit, run: FitRun) -> None:
    """The user's fit on `run`; ResumeCheckError when it cannot be imported, or never called
    the callback as far as resume-check needs."""
    fit: Callable[[FitRun], Any] = load_factory(path)
    fit(run)
    path = path if isinstance(path, str) else getattr(path, "__qualname__", repr(path))
    what = "straight" if run.resume_from is None else "resumed"
    if not run.trail or run.final is None:
        raise ResumeCheckError(f"the {what} run of {path} never reached the resume-check "
                               "callback: pass ResumeCheckCallback(run) (transformers) or "
                               "ResumeCheckLightning(run) (Lightning) to its callbacks")
    if max(run.trail) != run.steps:
        raise ResumeCheckError(f"the {what} run of {path} stopped at step {max(run.trail)}, "
                               f"not {run.steps}: set the trainer's max_steps to run.steps")
    if run.resume_from is None and run.checkpoint is None:
        raise ResumeCheckError(f"the straight run of {path} saved no checkpoint at step "
                               f"{run.at}")


def check_fit(fit: Fit, *, steps: int, at: int, atol: float | None = None,
              fresh_process: bool = True, cwd: str | os.PathLike | None = None
              ) -> ResumeReport:
    """The straight run here, the resume from the framework's checkpoint at `at` in a fresh
    process (module docstring; fresh_process=False: in this one, after the straight run);
    the report of where the two differ."""
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (steps, at)) or not (
            1 <= at < steps):
        raise ResumeCheckError(f"steps {steps!r}, at {at!r}: need integers with "
                               "1 <= at < steps")
    if fresh_process and not isinstance(fit, str):
        raise ResumeCheckError("a fresh process needs the fit as an importable "
                               "'module:function' path, not a callable (or pass "
                               "fresh_process=False)")
    where = Path.cwd() if cwd is None else Path(cwd)
    with tempfile.TemporaryDirectory(prefix="resume-check-") as tmp:
        straight = FitRun(steps, at, str(Path(tmp) / "straight"))
        _fit(fit, straight)
        assert straight.checkpoint is not None and straight.final is not None
        out = Path(tmp) / "resumed.pt"
        job = {"fit": fit, "steps": steps, "at": at, "dir": str(Path(tmp) / "resumed"),
               "resume_from": straight.checkpoint, "out": str(out)}
        if fresh_process:
            proc = child_process(CHILD, job, where, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
            _, stderr = proc.communicate(timeout=TIMEOUT)
            if proc.returncode != 0:
                lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
                raise TrainerFailed("the resumed process failed: "
                                    + (lines[-1] if lines else "no output"))
        else:
            _resume(job)
        resumed = torch.load(out, weights_only=True)
    trail = {int(t): d for t, d in resumed["trail"].items()}
    first = straight.trail[min(straight.trail)]["observed"]
    used = {n for n in first if n.startswith("rng.")
            and any(d["observed"].get(n) != first[n] for d in straight.trail.values())}
    gaps = [(t, d) for t in range(at + 1, steps + 1)
            if (d := parted(straight.trail[t], trail[t], used) if t in trail else [])]
    if straight.loaded is not None and resumed["loaded"] is not None and (
            d := parted(straight.loaded, resumed["loaded"], used)):
        gaps.insert(0, (at, d))
    final = compare_final(straight.final, resumed["final"], atol)
    missing = [t for t in range(at + 1, steps + 1) if t not in trail]
    notes = (f"the resumed run recorded no digests at steps {missing}",) if missing else ()
    return ResumeReport(steps, at, atol, not final, gaps[0][0] if gaps else None,
                        tuple(gaps[0][1]) if gaps else (), tuple(final), None, notes,
                        int(resumed["pid"]))


def _resume(job: dict[str, Any]) -> None:
    """The user's fit resumed from job["resume_from"]; what it recorded, to job["out"]."""
    run = FitRun(job["steps"], job["at"], job["dir"], job["resume_from"])
    _fit(job["fit"], run)
    torch.save({"trail": run.trail, "loaded": run.loaded, "final": run.final,
                "pid": os.getpid()}, job["out"])


def main() -> None:
    """The fresh process: the user's fit resumed; an error is one line on stderr, exit 1."""
    try:
        _resume(json.loads(sys.argv[1]))
    except (ResumeCheckError, TypeError) as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        raise SystemExit(1) from None
