"""The course's mini-project, assembled from the pieces this project builds.

    the prediction sheet and synchronized profile   parity/lab/cli/profile.py
    one fault postmortem (or all five)               parity/lab/runners/postmortem.py
    the optimization report                          parity/lab/runners/optimize.py
    the interrupted-and-resumed run                  a training process SIGKILLed while it
                                                     commits a checkpoint (below)

A piece whose command is not part of this checkout is reported as missing, never faked.
The rubric's grades are the functions at the end (the fault row's is
postmortem_record.fault_repair_row), each a function of its piece's evidence only, so a
test can hand each one evidence with a part removed and see it fall a grade.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parity.lab.runners.profile_grades import Row

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
    resumed_from = next((ln for ln in done.stderr.splitlines() if ln.startswith("resumed")),
                        "no resume line")
    return ResumeEvidence(killed, leftover, before, survivors, resumed_from, _digest(done),
                          expected)


# ---------------------------------------------------------------- the rubric

def _interval_stated(g: Any) -> bool:
    ratio, low, high = g.speedup
    return all(math.isfinite(v) for v in g.speedup) and low <= ratio <= high


def _result_words(low: float, high: float) -> str:
    """How the rubric names the speedup's interval: null when it holds 1."""
    if low <= 1.0 <= high:
        return "a null result reported as null"
    return "a slowdown reported as one" if high < 1.0 else "a speedup reported as one"


def optimization_rows(g: Any, stem: str, said: str) -> list[Row]:
    """optimization validity and honest timing (optimization), from the gauntlet `g` whose
    report is `stem`.md and whose speedup reads `said`.

    validity: FAIL when a check failed (g.passed); Pass when all passed; Strong when the
    speedup is also stated with its interval and the mechanism's expectation.
    timing: FAIL unless both sides have the same number (>= 3) of positive finite repeats
    and the interval is finite and brackets the ratio; Strong when there are also >= 10
    repeats a side, each side's first call was timed apart (NOTE [ The first call is timed
    apart ]), and the ratio measured on the other clock (wall if CPU time was stated, and the
    other way) falls inside the stated interval: the verdict does not hang on the clock."""
    stated = _interval_stated(g) and bool(g.opt.expectation)
    validity = "FAIL" if not g.passed else ("Strong" if stated else "Pass")
    base, optimized = g.timing.samples(g.opt.timer)
    repeats = (len(base) == len(optimized) >= 3
               and all(math.isfinite(v) and v > 0 for v in (*base, *optimized)))
    honest = repeats and _interval_stated(g)
    clock = "CPU" if g.opt.timer == "cpu" else "wall"
    other_b, other_o = g.timing.samples("wall" if g.opt.timer == "cpu" else "cpu")
    other = (float(np.median(other_b) / np.median(other_o))
             if len(other_b) and len(other_o) and np.median(other_o) > 0 else float("nan"))
    first = all(g.timing.first_call_wall.get(side, 0) > 0 for side in ("baseline", "optimized"))
    _, low, high = g.speedup
    strong = honest and len(base) >= 10 and first and low <= other <= high
    timing = "Strong" if strong else ("Pass" if honest else "FAIL")
    why = {"FAIL": "too few or unequal repeats, or no interval around the ratio",
           "Pass": "spread and method stated; but " + (
               "fewer than 10 repeats a side" if len(base) < 10 else
               "the first calls were not timed apart" if not first else
               f"the other clock's ratio {other:.3f} falls outside the interval"),
           "Strong": f"spread and method stated, first calls timed apart; the "
                     f"{'wall' if clock == 'CPU' else 'CPU'} clock's ratio {other:.3f} lies in "
                     f"the {clock} interval [{low:.3f}, {high:.3f}]; "
                     f"{_result_words(low, high)}"}[timing]
    return [("optimization validity", validity,
             f"{stem}.md: claims, learning controls, exact resume; speedup {said}",
             {"FAIL": "a check failed",
              "Pass": "every check passed; the speedup's interval or expectation is missing",
              "Strong": "every check passed and the speedup is stated with its interval and "
                        "the mechanism's expectation"}[validity]),
            ("honest timing (optimization)", timing,
             f"{stem}.md: {len(base)} interleaved repeats per side, median, IQR, bootstrap "
             f"interval; {clock} time stated", why)]


def resume_row(ev: ResumeEvidence) -> Row:
    """Pass: the run resumed from a checkpoint (its resume line) to the uninterrupted digest;
    Strong: and the kill landed mid-commit (a temporary file left), every checkpoint there
    before the kill survived, and the resume took the newest of them."""
    resumed = ev.resumed_from.startswith("resumed from ")
    newest = max(ev.survivors, default="")
    strong = (resumed and ev.exact and ev.killed and bool(ev.leftover_temp)
              and set(ev.before_kill) <= set(ev.survivors)
              and ev.resumed_from.startswith(f"resumed from {newest} "))
    grade = "Strong" if strong else ("Pass" if resumed and ev.exact else "FAIL")
    return ("resume", grade,
            f"resume.md: killed while committing step {KILL_AT}; survivors "
            f"{', '.join(ev.survivors)}; digests {'equal' if ev.exact else 'DIFFER'}",
            {"Strong": "the kill left a temporary file, every earlier checkpoint survived and "
                       "loaded, the run resumed from the newest, the resumed digest is the "
                       "uninterrupted one",
             "Pass": "digest equal after a resume",
             "FAIL": "the resumed run differs" if resumed else "the run did not resume"}[grade])
