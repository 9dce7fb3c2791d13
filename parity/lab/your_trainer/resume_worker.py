"""The trainer's side of the resume check (resume_check.py): building a trainer
from its factory, the protocol's three calls, the save and the load, the resumed run, and
the fresh process that runs it.

The fresh process is

    python -c "from parity.lab.your_trainer.resume_worker import main; main()" JOB

with JOB a JSON object {mode, factory, checkpoint, steps, at, out}: mode "resume" loads
`checkpoint`, steps to `steps` and torch.saves its digests and final state to `out`; mode
"kill" takes `at` steps, saves, takes one more, and saves again into the same file, printing
SAVING once that payload is written and waiting (before the rename) for the SIGKILL.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

import ckpt
from parity.lab.your_trainer.resume_state import check_storable, digests, flatten, observe
from torch_impl import resume

SAVING = "resume-check: saving"  # the killed child's line: its payload is written, not renamed
Factory = Callable[[], Any] | str
Trail = list[dict[str, dict[str, str]]]  # per step: {"state": {entry: digest}, "observed": ...}


class ResumeCheckError(ValueError):
    """Bad input: a factory that does not import or build, a trainer without the protocol,
    steps out of range."""


class TrainerFailed(RuntimeError):
    """The trainer raised in a child process (its last line of stderr is the message)."""


def load_factory(factory: Factory) -> Callable[[], Any]:
    """The factory itself, or the function a "module:function" path names."""
    if callable(factory):
        return factory
    module_name, _, function = str(factory).partition(":")
    if not module_name or not function:
        raise ResumeCheckError(f"factory {factory!r}: expected module:function "
                               "(e.g. mytrain.loop:make_trainer)")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise ResumeCheckError(f"factory {factory}: cannot import {module_name}: "
                               f"{type(e).__name__}: {e}") from None
    found = getattr(module, function, None)
    if not callable(found):
        raise ResumeCheckError(f"factory {factory}: {module_name} has no function {function}")
    return found


class Trainer:
    """The protocol's three calls, from an object or a tuple of callables; `obj` is what is
    observed (NOTE [ Observed beside the state ] in resume_state.py)."""

    def __init__(self, made: Any) -> None:
        if isinstance(made, tuple) and len(made) == 3 and all(map(callable, made)):
            self.state_dict, self.load_state_dict, self.step = made
            self.obj = None
            return
        missing = [m for m in ("state_dict", "load_state_dict", "step")
                   if not callable(getattr(made, m, None))]
        if missing:
            raise ResumeCheckError(f"the factory returned a {type(made).__name__} without "
                                   f"{', '.join(missing)}: it must return an object with "
                                   "state_dict(), load_state_dict(state) and step(), or a "
                                   "tuple of those three callables")
        self.state_dict, self.load_state_dict, self.step = (
            made.state_dict, made.load_state_dict, made.step)
        self.obj = made

    def digests(self) -> dict[str, dict[str, str]]:
        state = self.state_dict()
        check_storable(state)
        return {"state": digests(flatten(state)), "observed": digests(observe(self.obj))}


def build(factory: Factory) -> Trainer:
    """A fresh trainer from the factory (ResumeCheckError if it cannot be built)."""
    try:
        made = load_factory(factory)()
    except ResumeCheckError:
        raise
    except Exception as e:
        raise ResumeCheckError(f"the factory raised {type(e).__name__}: {e}") from e
    return Trainer(made)


def save(path: Path, step: int, state: Mapping[str, Any],
         pause: Callable[[], None] | None = None) -> None:
    """The state at `step`, atomically, in the project's container (torch.save's bytes,
    torch_impl/resume.py); `pause` runs once the payload is written, before the rename."""
    check_storable(state)

    def write(out: Any) -> None:
        resume.write_state({"step": step, "state": state}, out)
        if pause is not None:
            pause()

    ckpt.save_container(path, resume.PAYLOAD, resume.WRITER, write, None)


def read(path: Path) -> tuple[int, dict[str, Any]]:
    """(step, state) of a saved file, its digest verified, loaded with weights_only=True."""
    saved = resume.load_checkpoint(path)
    return int(saved["step"]), saved["state"]


def resumed_run(factory: Factory, path: Path, steps: int) -> dict[str, Any]:
    """A fresh trainer, the state `path` holds loaded into it, stepped to `steps`: the trail
    of digests from the load on, and the final state."""
    at, state = read(path)
    trainer = build(factory)
    trainer.load_state_dict(state)
    trail: Trail = [trainer.digests()]
    for _ in range(at, steps):
        trainer.step()
        trail.append(trainer.digests())
    final = trainer.state_dict()
    check_storable(final)
    return {"trail": trail, "final": final, "pid": os.getpid()}


def main() -> None:
    """The fresh process (module docstring); an error is one line on stderr, exit status 1."""
    job = json.loads(sys.argv[1])
    path = Path(job["checkpoint"])
    try:
        if job["mode"] == "kill":
            trainer = build(job["factory"])
            for _ in range(job["at"]):
                trainer.step()
            save(path, job["at"], trainer.state_dict())
            trainer.step()

            def wait_for_the_kill() -> None:
                print(SAVING, flush=True)
                sys.stdin.read()

            save(path, job["at"] + 1, trainer.state_dict(), pause=wait_for_the_kill)
            return
        torch.save(resumed_run(job["factory"], path, job["steps"]), job["out"])
    except (ResumeCheckError, TypeError) as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        raise SystemExit(1) from None
