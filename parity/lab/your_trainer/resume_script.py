"""Resume equivalence of a training script run as it is run: its own command line, its own
checkpoint file, nothing imported from it (nanoGPT's train.py trains at import, and its
configurator reads every `--key=value` of sys.argv, so it cannot be a factory).

    check_script("python train.py --out_dir={dir} --max_iters={steps}",
                 resume_flag="--init_from=resume", state="{dir}/ckpt.pt", steps=N, at=k)

The command is split as a shell splits it (shlex), then in each word `{steps}` becomes the
steps of that run and `{dir}` a fresh empty folder of that run; `state` names the file the
script saves when it stops (its `{dir}` the same folder). Four runs, one after the other,
in the current folder, with this process's environment (resume-check's own argv never
reaches the script: each run is `subprocess.run(words)`):
  1. straight:  the command with steps N, in folder A;
  2. stopped:   the command with steps k, in folder B;
  3. resumed:   the command with steps N, in folder B, and the resume flag's words appended;
  4. probe:     the resumed command in folder C, from B's file after step k, moved (below).
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
Whether the resumed run loaded the file at all: a script that ignores the flag and trains N
steps from its seed ends where the straight run ends, and would read "exact". So a fourth
run, the probe, resumes from the stopped run's file with every floating tensor element in it
moved (x + (|x| + 1) 2^-8; a file without floating tensors: every Python float; written back
in the file's own format; hyperparameters beside tensors, an optimizer's betas, are left as
they are, moved past 1 they would break the step): if the probe ends bit for bit where the
resumed run ended, the saved values decide nothing, and the verdict is that the resumed run
does not read the file (entry: the file's name, where "loaded"). A file with no floating
value to move is not probed, and a note says so.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from parity.lab.your_trainer.resume_check import Difference, ResumeReport, compare_final
from parity.lab.your_trainer.resume_state import flatten
from parity.lab.your_trainer.resume_worker import ResumeCheckError, TrainerFailed

__all__ = ["RUNS", "check_script"]

TIMEOUT = 3600.0  # seconds one run of the script may take
PLACEHOLDERS = ("{steps}", "{dir}")
RUNS = ("straight", "stopped", "resumed", "probe")  # in the order they run


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


def _moved(value: Any, floats: bool) -> tuple[Any, int]:
    """`value` with every floating tensor element moved by (|x| + 1) 2^-8 (`floats`: every
    Python float instead), and how many were moved."""
    if isinstance(value, torch.Tensor):
        if floats or not value.is_floating_point() or value.numel() == 0:
            return value, 0
        return value + (value.abs() + 1) * 2.0**-8, value.numel()
    if isinstance(value, float):
        return (value + (abs(value) + 1) * 2.0**-8, 1) if floats else (value, 0)
    if isinstance(value, dict):
        pairs = {k: _moved(v, floats) for k, v in value.items()}
        return {k: v for k, (v, _) in pairs.items()}, sum(n for _, n in pairs.values())
    if isinstance(value, list | tuple):
        items = [_moved(v, floats) for v in value]
        moved = [v for v, _ in items]
        return (moved if isinstance(value, list) else type(value)(moved)), sum(
            n for _, n in items)
    return value, 0


def _write_probe(saved: Path, probe: Path) -> str | None:
    """The stopped run's file with its floating tensors moved (none: its Python floats; the
    hyperparameters beside tensors, an optimizer's betas, stay as they are), at `probe`;
    None, or why it was not written (a note)."""
    state = _state("stopped", saved)
    moved, count = _moved(state, floats=False)
    if count == 0:
        moved, count = _moved(state, floats=True)
    if count == 0:
        return f"not probed: {saved.name} holds no floating value to move"
    probe.parent.mkdir(parents=True, exist_ok=True)
    torch.save(moved, probe, _use_new_zipfile_serialization=zipfile.is_zipfile(saved))
    return None


def check_script(command: str, *, resume_flag: str, state: str = "{dir}/ckpt.pt", steps: int,
                 at: int, atol: float | None = None, cwd: str | os.PathLike | None = None,
                 progress: Callable[[str], None] | None = None,
                 ignore: tuple[str, ...] = ()) -> ResumeReport:
    """Run the script straight, stopped at `at`, resumed and probed (module docstring); the
    report of the entries in which the two saved states differ (first, a file the resumed
    run does not read), those matching an `ignore` pattern listed apart. `progress` is told
    each run's name as it starts."""
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
        a, b, c = (Path(tmp) / name for name in ("straight", "resumed", "probe"))
        for folder in (a, b, c):
            folder.mkdir()
        runs = [("straight", _fill(words, steps, a)), ("stopped", _fill(words, at, b)),
                ("resumed", _fill(words, steps, b) + _fill(flag, steps, b)),
                ("probe", _fill(words, steps, c) + _fill(flag, steps, c))]
        file = {f: Path(state.replace("{dir}", str(f))) for f in (a, b, c)}
        pid, unprobed, straight = 0, None, {}
        for what, argv in runs:
            if what == "probe" and unprobed is not None:
                break
            if progress is not None:
                progress(what)
            if what == "resumed":  # the stopped run's file, before the resume rewrites it
                unprobed = _write_probe(file[b], file[c])
            run_pid = _run(what, argv, where)
            pid = run_pid if what == "resumed" else pid
            if what == "straight":
                straight = _state("straight", file[a])
        resumed = _state("resumed", file[b])
        probed = None if unprobed is not None else _state("probe", file[c])
    final = compare_final(straight, resumed, atol)
    if probed is not None and not compare_final(resumed, probed, None):
        final.insert(0, Difference(file[b].name, "loaded", "the probe, resumed from it with "
                                   "every floating value moved, ends bit for bit where the "
                                   "resumed run ended: the resumed run does not read it"))
    ran = runs if unprobed is None else runs[:3]
    notes = ["the runs (their states compared at the end only):",
             *(f"  {what + ':':9} {shlex.join(argv)}" for what, argv in ran)]
    if unprobed is not None:
        notes.append(unprobed)
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
