"""Resume equivalence of a training script run as it is run: its own command line, its own
checkpoint file, nothing imported from it (nanoGPT's train.py trains at import, and its
configurator reads every `--key=value` of sys.argv, so it cannot be a factory).

    check_script("python train.py --out_dir={dir} --max_iters={steps}",
                 resume_flag="--init_from=resume", state="{dir}/ckpt.pt", steps=N, at=k)

The command is split as a shell splits it (shlex), then in each word `{steps}` becomes the
steps of that run and `{dir}` a fresh empty folder of that run; `state` names the file the
script saves when it stops (its `{dir}` the same folder). Three runs, one after the other,
in the current folder, with this process's environment (resume-check's own argv never
reaches the script: each run is `subprocess.run(words)`):
  1. straight:  the command with steps N, in folder A;
  2. stopped:   the command with steps k, in folder B;
  3. resumed:   the command with steps N, in folder B, and the resume flag's words appended.
Then the two state files, A's and B's, each read with torch.load(weights_only=True), are
compared entry by entry as the factory mode compares its final states (resume_check.py):
bit for bit, or within `atol`, the entries that differ named by dotted path. A script's
steps are not seen one by one, so there is no step at which the runs part, only what
differs at the end.
Entries the runs' own command lines make differ (nanoGPT's `config` records out_dir, the
run's own folder, and init_from, the resume flag's value) can be named with `ignore`
(fnmatch patterns of dotted entry names): they are left out of the verdict and listed under
it, what differed in each; a pattern that matches no entry of either state is a note too
(a typo would otherwise ignore nothing, silently).
Not seen: whether the resumed run loaded the file at all. A script that ignores the flag and
trains N steps from its seed ends where the straight run ends, and is "exact".
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from parity.lab.your_trainer.resume_check import ResumeReport, compare_final
from parity.lab.your_trainer.resume_state import flatten
from parity.lab.your_trainer.resume_worker import ResumeCheckError, TrainerFailed

__all__ = ["check_script"]

TIMEOUT = 3600.0  # seconds one run of the script may take
PLACEHOLDERS = ("{steps}", "{dir}")


def _words(command: str, what: str, need: tuple[str, ...]) -> list[str]:
    """The command's words; ResumeCheckError when it cannot be split, lacks a placeholder
    in `need`, or holds one resume-check does not fill."""
    try:
        words = shlex.split(command)
    except ValueError as e:
        raise ResumeCheckError(f"{what} {command!r}: cannot split it: {e}") from None
    if not words:
        raise ResumeCheckError(f"{what}: empty")
    for word in words:
        for name in re.findall(r"\{[^{}]*\}", word):
            if name not in PLACEHOLDERS:
                raise ResumeCheckError(f"{what} {command!r}: unknown placeholder {name} (the "
                                       f"placeholders: {', '.join(PLACEHOLDERS)})")
    for name in need:
        if not any(name in w for w in words):
            raise ResumeCheckError(
                f"{what} {command!r} has no {name}: resume-check puts there "
                + ("the steps of each run (e.g. --max_iters={steps})" if name == "{steps}"
                   else "a fresh folder for each run (e.g. --out_dir={dir})"))
    return words


def _fill(words: list[str], steps: int, folder: Path) -> list[str]:
    return [w.replace("{steps}", str(steps)).replace("{dir}", str(folder)) for w in words]


def _run(what: str, argv: list[str], cwd: Path) -> int:
    """One run of the script; its process id. TrainerFailed with the last line of its stderr
    when it exits non-zero."""
    try:
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        raise ResumeCheckError(f"cannot run {argv[0]!r}: {e.strerror or e}") from None
    try:
        _, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        raise TrainerFailed(f"the {what} run ({shlex.join(argv)}) exited {proc.returncode}: "
                            + (lines[-1] if lines else "no output"))
    return proc.pid


def _state(what: str, path: Path) -> dict[str, Any]:
    """The state file a run saved, read with weights_only=True."""
    if not path.is_file():
        raise TrainerFailed(f"the {what} run saved no {path.name} where --state says "
                            f"({path})")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise TypeError(f"the {what} run's {path.name} cannot be read with "
                        f"torch.load(weights_only=True): {first}") from None
    if not isinstance(state, dict):
        raise TypeError(f"the {what} run's {path.name} holds a {type(state).__name__}, "
                        "not a dict")
    return state


def check_script(command: str, *, resume_flag: str, state: str = "{dir}/ckpt.pt", steps: int,
                 at: int, atol: float | None = None, cwd: str | os.PathLike | None = None,
                 progress: Callable[[str], None] | None = None,
                 ignore: tuple[str, ...] = ()) -> ResumeReport:
    """Run the script straight, stopped at `at`, and resumed (module docstring); the report
    of the entries in which the two saved states differ, those matching an `ignore` pattern
    listed apart. `progress` is told each run's name as it starts."""
    if isinstance(ignore, str):
        raise ResumeCheckError(f"ignore {ignore!r}: give a tuple of entry patterns")
    for pattern in ignore:
        if not isinstance(pattern, str) or not pattern.strip():
            raise ResumeCheckError(f"--ignore {pattern!r}: an entry pattern cannot be empty")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (steps, at)) or not (
            1 <= at < steps):
        raise ResumeCheckError(f"steps {steps!r}, at {at!r}: need integers with "
                               "1 <= at < steps")
    words = _words(command, "the script command", PLACEHOLDERS)
    flag = _words(resume_flag, "the resume flag", ())
    if "{dir}" not in state:
        raise ResumeCheckError(f"--state {state!r} has no {{dir}}: the file each run saves "
                               "is in its own folder (e.g. {dir}/ckpt.pt)")
    where = Path.cwd() if cwd is None else Path(cwd)
    program = Path(where, words[0]) if os.sep in words[0] else shutil.which(words[0])
    if program is None or not os.access(program, os.X_OK) or Path(program).is_dir():
        raise ResumeCheckError(f"cannot run {words[0]!r}: no such program")
    with tempfile.TemporaryDirectory(prefix="resume-check-") as tmp:
        a, b = Path(tmp) / "straight", Path(tmp) / "resumed"
        a.mkdir()
        b.mkdir()
        runs = [("straight", _fill(words, steps, a)), ("stopped", _fill(words, at, b)),
                ("resumed", _fill(words, steps, b) + _fill(flag, steps, b))]
        pid = 0
        for what, argv in runs:
            if progress is not None:
                progress(what)
            pid = _run(what, argv, where)
        straight = _state("straight", Path(state.replace("{dir}", str(a))))
        resumed = _state("resumed", Path(state.replace("{dir}", str(b))))
    final = compare_final(straight, resumed, atol)
    notes = ["the runs (their states compared at the end only):",
             *(f"  {what + ':':9} {shlex.join(argv)}" for what, argv in runs)]
    if ignore:
        names = [*flatten(straight), *flatten(resumed)]
        left = [d for d in final if any(fnmatch.fnmatchcase(d.entry, p) for p in ignore)]
        final = [d for d in final if d not in left]
        notes.append("ignored (--ignore): " + (", ".join(f"{d.entry} ({d.detail})"
                                                         for d in left) or "nothing differed"))
        notes += [f"--ignore {p!r} matches no entry" for p in ignore
                  if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    return ResumeReport(steps, at, atol, not final, None, (), tuple(final), None,
                        tuple(notes), pid)
