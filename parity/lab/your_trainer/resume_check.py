"""Resume equivalence for any trainer: N steps straight against k steps, a save, a fresh
process, a load and N - k steps, compared entry by entry.

The trainer is anything a factory returns that has

    state_dict() -> dict        everything a resume needs (nested dicts, lists, tensors, ...)
    load_state_dict(state)      the inverse, on a trainer the factory has just built
    step()                      one training step (its return value is ignored)

or a tuple of those three callables. The factory takes no arguments and builds the same
trainer every time (it seeds what it draws from). For a fresh process it is named by an
importable path, `package.module:function`, imported in the child from the working folder
`cwd` (default: the current one) with this process's sys.path.

    check_resume(factory, steps=N, at=k)   -> ResumeReport (print it; .ok, .summary())
    assert_resumes(factory, steps=N, at=k) -> None, or AssertionError with the report

What check_resume does:
  1. in this process: factory(), then N steps; after each step t the digest of every entry
     of state_dict() and of what is observed on the trainer (NOTE [ Observed beside the
     state ] in resume_state.py); at t = k the state is saved (torch.save's bytes
     in this project's checkpoint container, written atomically: torch_impl/resume.py).
  2. a fresh process (with fresh_process=False: this one): factory(), load_state_dict of the
     file read back with torch.load(weights_only=True), the digests right after the load
     (t = k) and after each of the N - k steps, and the final state_dict().
  3. the verdict: every entry of the two final states equal bit for bit, or within `atol`
     (floating tensors and floats; everything else exactly, NaN where NaN). The report names
     the entries that differ (dotted paths, the first first) and the step at which the runs
     part: the first t >= k whose digests differ (t = k: right after the load). A state
     that stops following the trainer (built once, returned again) fails it too, the stale
     entry first (NOTE [ A state that does not move ] in resume_stale.py).
With kill=True the checkpoint comes from another fresh process that takes k steps, saves,
takes step k + 1 and is SIGKILLed while saving again into the same file (the payload written,
the rename not yet done); the check then requires that file to hold step k, whole (its digest
verified) and equal to this process's state at k, and resumes from it.
A state that torch.load(weights_only=True) cannot read back is a TypeError naming the entry.
A loop that is no factory: a script run with its own argv (resume_script.py), a loop a
framework owns, through a callback (resume_fit.py); both end in this module's comparison.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from parity.lab.your_trainer.resume_stale import stale_entry
from parity.lab.your_trainer.resume_state import digests, flatten
from parity.lab.your_trainer.resume_worker import (
    SAVING,
    Factory,
    ResumeCheckError,
    Trail,
    TrainerFailed,
    build,
    read,
    resumed_run,
    save,
)

__all__ = ["Difference", "ResumeCheckError", "ResumeReport", "TrainerFailed", "assert_resumes",
           "check_resume"]

PROJECT = Path(__file__).resolve().parents[3]  # the folder holding parity/ and torch_impl/
# -c puts the child's cwd first on sys.path; it is dropped (a folder ckpt/ there would shadow
# the project) and this process's sys.path given instead, through PYTHONPATH
CHILD = ("import sys; del sys.path[0]; "
         "from parity.lab.your_trainer.resume_worker import main; main()")
TIMEOUT = 600.0  # seconds a child may take


@dataclass(frozen=True)
class Difference:
    """One entry that differs: its dotted path, "state" (in state_dict()), "observed" (on
    the trainer or a global generator only) or "loaded" (a script's checkpoint file its
    resumed run does not read: resume_script.py), and how it differs."""

    entry: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.entry} ({self.where}): {self.detail}"


@dataclass(frozen=True)
class ResumeReport:
    """`ok`: the final states agree (bit for bit, or within atol). `parted_at`: the first step
    t >= at whose digests differ (None: never), `parted` the entries that differ there;
    `final` the entries of the final state that differ; `killed` what the kill left;
    `resumed_pid` the process that resumed."""

    steps: int
    at: int
    atol: float | None
    ok: bool
    parted_at: int | None
    parted: tuple[Difference, ...]
    final: tuple[Difference, ...]
    killed: str | None = None
    notes: tuple[str, ...] = field(default=())
    resumed_pid: int = 0  # the process that loaded and resumed

    def summary(self) -> str:
        """The last line: `resume-check: exact`, `... within atol X ...`, `... differs: first
        entry E, the runs part at step S at P` (E: of the final state; P: where they part)."""
        if self.ok and self.parted_at is None:
            return "resume-check: exact"
        if self.ok and self.atol is None:  # only observed entries parted, and not for good
            return (f"resume-check: exact (observed entries part at step {self.parted_at}, "
                    "the saved state never)")
        if self.ok:
            return (f"resume-check: within atol {self.atol:g} (bit for bit the runs part at "
                    f"step {self.parted_at})")
        first = self.final[0].entry if self.final else "-"
        if self.final and self.final[0].where == "loaded":  # resume_script.py's probe
            return f"resume-check: differs: the resumed run does not read {first}"
        if self.parted_at is None:  # a script's states are compared at the end only
            return f"resume-check: differs: first entry {first}"
        at = f" at {self.parted[0].entry}" if self.parted else ""
        return (f"resume-check: differs: first entry {first}, the runs part at step "
                f"{self.parted_at}{at}")

    def __str__(self) -> str:
        lines = [f"resumed at step {self.at} of {self.steps}"
                 + (" from a process SIGKILLed while saving" if self.killed else "")]
        if self.killed:
            lines.append(f"  {self.killed}")
        if self.parted_at is not None:
            when = ("right after the load" if self.parted_at == self.at
                    else f"after step {self.parted_at}")
            lines.append(f"the runs part at step {self.parted_at} ({when}):")
            lines += [f"  {d}" for d in self.parted[:8]]
            if len(self.parted) > 8:
                lines.append(f"  ... and {len(self.parted) - 8} more")
        if self.final:
            lines.append(f"final state: {len(self.final)} entries differ:")
            lines += [f"  {d}" for d in self.final[:5]]
        lines += list(self.notes)
        lines.append(self.summary())
        return "\n".join(lines)


# ---------------------------------------------------------------- comparing


def _used(straight: Trail) -> set[str]:
    """Observed global generators the straight run draws from (their state changes)."""
    first = straight[0]["observed"]
    return {name for name in first if name.startswith("rng.")
            and any(t["observed"].get(name) != first[name] for t in straight[1:])}


def parted(a: dict[str, dict[str, str]], b: dict[str, dict[str, str]], used: set[str]
           ) -> list[Difference]:
    """The entries whose digests differ between two runs at one step, state entries first,
    each side's order; an unused global generator is not compared."""
    out = []
    for where in ("state", "observed"):
        x, y = a[where], b[where]
        for name in [*x, *(n for n in y if n not in x)]:
            if name.startswith("rng.") and name not in used:
                continue
            if name not in y:
                out.append(Difference(name, where, "missing after the resume"))
            elif name not in x:
                out.append(Difference(name, where, "only in the resumed run"))
            elif x[name] != y[name]:
                out.append(Difference(name, where, "differs"))
    return out


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def compare_leaf(a: Any, b: Any, atol: float | None) -> str | None:
    """How two leaves differ, or None: tensors by dtype, shape and bits, or max |a - b| <=
    atol for floating ones with NaN where NaN; other values by ==."""
    if type(a) is not type(b):
        return f"a {type(a).__name__} straight, a {type(b).__name__} resumed"
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return (f"{_name(a.dtype)} {tuple(a.shape)} straight, {_name(b.dtype)} "
                    f"{tuple(b.shape)} resumed")
        x, y = a.detach().cpu().reshape(-1), b.detach().cpu().reshape(-1)
        if torch.equal(x.view(torch.uint8) if x.numel() else x,
                       y.view(torch.uint8) if y.numel() else y):
            return None
        if not (a.is_floating_point() or a.is_complex()):
            return f"{int((x != y).sum())} of {x.numel()} values differ"
        wide = torch.complex128 if a.is_complex() else torch.float64
        x, y = x.to(wide), y.to(wide)
        d = (x - y).abs()
        d[(x == y) | (torch.isnan(x) & torch.isnan(y))] = 0  # equal infinities, NaN and NaN
        d = d.nan_to_num(nan=math.inf, posinf=math.inf)  # NaN on one side only
        gap = float(d.max())
        if atol is not None and gap <= atol:
            return None
        return (f"max |Δ| {gap:.3g} over {int((d != 0).sum())} of {x.numel()} values"
                + (f" (atol {atol:g})" if atol is not None else " (bit for bit)"))
    if isinstance(a, float) and atol is not None and abs(a - b) <= atol:
        return None
    if a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)):
        return None
    return f"{a!r} straight, {b!r} resumed"


def compare_final(a: Mapping[str, Any], b: Mapping[str, Any], atol: float | None
                  ) -> list[Difference]:
    """Every entry of the two final states that differs (compare_leaf), in a's order."""
    x, y = flatten(a), flatten(b)
    out = []
    for name in [*x, *(n for n in y if n not in x)]:
        if name not in y:
            out.append(Difference(name, "state", "missing after the resume"))
        elif name not in x:
            out.append(Difference(name, "state", "only in the resumed run"))
        elif (detail := compare_leaf(x[name], y[name], atol)) is not None:
            out.append(Difference(name, "state", detail))
    return out


# ---------------------------------------------------------------- running


def child_process(code: str, job: dict[str, Any], cwd: Path, **popen: Any
                  ) -> subprocess.Popen:
    """A fresh interpreter running `code` (`python -c`) on `job`, with this process's sys.path
    (this project's folder first) in the user's working folder."""
    paths = [str(PROJECT), *(str(Path(p or ".").resolve()) for p in sys.path
                             if Path(p or ".").is_dir())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(job)], cwd=cwd, env=env,
                            text=True, **popen)


def _failed(what: str, stderr: str) -> TrainerFailed:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return TrainerFailed(f"the {what} process failed: {lines[-1] if lines else 'no output'}")


def _kill_while_saving(factory: str, checkpoint: Path, steps: int, at: int, cwd: Path) -> str:
    """Run the kill child (resume_worker's "kill" mode) and SIGKILL it the moment it says it
    is saving (whatever the trainer prints before that is skipped); what it left behind, in
    one line. Its stderr goes to a file, so no pipe fills while this process reads stdout."""
    with tempfile.TemporaryFile("w+") as err:
        proc = child_process(CHILD, {"mode": "kill", "factory": factory,
                                     "checkpoint": str(checkpoint), "steps": steps, "at": at,
                                     "out": ""}, cwd, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=err)
        try:
            assert proc.stdout is not None and proc.stdin is not None
            while (line := proc.stdout.readline()) and line.strip() != SAVING:
                pass
            if not line:  # it ended without reaching the second save
                proc.wait(timeout=TIMEOUT)
                err.seek(0)
                raise _failed("killed", err.read())
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
    left = sorted(p.name for p in checkpoint.parent.iterdir() if p != checkpoint)
    return (f"killed at step {at + 1} with its payload written and not renamed "
            f"(left: {', '.join(left) or 'nothing'}); {checkpoint.name} still holds step {at}")


def check_resume(factory: Factory, *, steps: int, at: int, atol: float | None = None,
                 kill: bool = False, fresh_process: bool = True,
                 cwd: str | os.PathLike | None = None) -> ResumeReport:
    """Run the trainer `factory` builds straight for `steps` steps and resumed from step `at`
    (module docstring); the report of where the two differ. `factory` is a callable, or a
    "module:function" path (required for a fresh process, and with kill)."""
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (steps, at)) or not (
            1 <= at < steps):
        raise ResumeCheckError(f"steps {steps!r}, at {at!r}: need integers with "
                               "1 <= at < steps")
    if atol is not None and not (isinstance(atol, int | float) and math.isfinite(atol)
                                 and atol >= 0):
        raise ResumeCheckError(f"atol {atol!r}: need a finite number >= 0, or None for bit "
                               "for bit")
    if (fresh_process or kill) and not isinstance(factory, str):
        raise ResumeCheckError("a fresh process needs the factory as an importable "
                               "'module:function' path, not a callable (or pass "
                               "fresh_process=False)")
    where = Path.cwd() if cwd is None else Path(cwd)
    with tempfile.TemporaryDirectory(prefix="resume-check-") as tmp:
        checkpoint = Path(tmp) / "ckpts" / "resume.ckpt"
        checkpoint.parent.mkdir()
        trainer = build(factory)
        straight: Trail = [trainer.digests()]
        for t in range(1, steps + 1):
            trainer.step()
            straight.append(trainer.digests())
            if t == at and not kill:
                save(checkpoint, at, trainer.state_dict())
        final = trainer.state_dict()
        killed, notes = None, []
        if kill:
            killed = _kill_while_saving(str(factory), checkpoint, steps, at, where)
            saved_at, saved = read(checkpoint)  # whole: its digest is verified
            if saved_at != at:
                raise ResumeCheckError(f"the checkpoint the kill left holds step {saved_at}, "
                                       f"not {at}: the save was not atomic")
            if digests(flatten(saved)) != straight[at]["state"]:
                notes.append(f"the killed process saved another state at step {at} than this "
                             "process reached: the factory does not build the same trainer "
                             "every time")
        if fresh_process or kill:
            out = Path(tmp) / "resumed.pt"
            proc = child_process(CHILD, {"mode": "resume", "factory": factory,
                                         "checkpoint": str(checkpoint), "steps": steps,
                                         "at": at, "out": str(out)}, where,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            _, stderr = proc.communicate(timeout=TIMEOUT)
            if proc.returncode != 0:
                raise _failed("resumed", stderr)
            resumed = torch.load(out, weights_only=True)
        else:
            resumed = resumed_run(factory, checkpoint, steps)
    trail, used = resumed["trail"], _used(straight)
    gaps = [(t, d) for t, (a, b) in enumerate(zip(straight[at:], trail, strict=True), at)
            if (d := parted(a, b, used))]
    final_gaps = compare_final(final, resumed["final"], atol)
    if (stale := stale_entry(straight)) is not None:  # NOTE [ A state that does not move ]
        name, twin, copied, lags = stale
        final_gaps.insert(0, Difference(name, "state", (
            f"state_dict() keeps {twin} as it was at step {copied} from step {lags} on, while "
            "the trainer's moves: a state built once and returned again (every save writes "
            "the first's values)")))
    return ResumeReport(steps, at, atol, not final_gaps, gaps[0][0] if gaps else None,
                        tuple(gaps[0][1]) if gaps else (), tuple(final_gaps), killed,
                        tuple(notes), resumed["pid"])


def assert_resumes(factory: Factory, *, steps: int, at: int, atol: float | None = None,
                   kill: bool = False, fresh_process: bool = True,
                   cwd: str | os.PathLike | None = None) -> ResumeReport:
    """check_resume, for a test: AssertionError carrying the report unless it is ok."""
    report = check_resume(factory, steps=steps, at=at, atol=atol, kill=kill,
                          fresh_process=fresh_process, cwd=cwd)
    if not report.ok:
        raise AssertionError(str(report))
    return report
