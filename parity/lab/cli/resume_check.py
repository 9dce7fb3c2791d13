"""Resume equivalence of your own trainer: N steps straight against k steps, a save, a fresh
process, a load and N - k steps; every entry of the final states compared bit for bit (or
within --atol), the first that differs named, and the step at which the two runs part.

    python -m parity resume-check module:factory --steps N --at K [--kill] [--atol X]
        [--same-process] [--json]
    python -m parity resume-check --script COMMAND --resume-flag FLAG [--state FILE]
        [--ignore ENTRY ...] --steps N --at K [--atol X] [--json]
    python -m parity resume-check --fit module:fit --steps N --at K [--atol X] [--json]

module:factory: a function, importable from the current folder, that takes no arguments and
returns a trainer: an object with state_dict(), load_state_dict(state) and step(), or a
tuple of those three callables; it builds the same trainer every time (it seeds what it
draws from). The checkpoint at K is torch.save's bytes, read back with
torch.load(weights_only=True): an entry that needs pickle is refused, by its name.
The runs part at the first step whose digests differ: the digests cover every entry of
state_dict() and what is observed on the trainer without being saved (torch's, numpy's and
Python's global generators when the run draws from them; the attributes that are modules,
optimizers, schedulers, GradScalers, generators or ints), so a missing entry is named at
the step of the load (docs/your-trainer.md).
--kill: the checkpoint comes from a process SIGKILLed while saving at step K + 1 into the
same file; the file must still hold step K, whole. --same-process: resume in this process
(faster; state kept in module globals is then not tested).
--script COMMAND: a training script run as it is run, with its own argv (none of
resume-check's): `{steps}` in COMMAND becomes each run's steps, `{dir}` a fresh folder of
each run; it runs straight for N steps, for K steps, then for N steps in the K run's folder
with --resume-flag's words appended (a FLAG that starts with a dash is written
--resume-flag=--resume); the two files --state names (default {dir}/ckpt.pt), read with
torch.load(weights_only=True), are compared entry by entry at the end; --ignore ENTRY
(repeatable, fnmatch) leaves out of the verdict an entry the runs' own command lines make
differ (nanoGPT's config.out_dir), listing what it left.
--fit module:fit: a function taking the run resume-check asks for (steps, at, dir,
resume_from) that trains with the project's callback in a framework's loop (transformers'
Trainer: parity.lab.your_trainer.callbacks.ResumeCheckCallback; Lightning:
parity.lab.your_trainer.callbacks_lightning.ResumeCheckLightning); the framework saves at K
and resumes from its own checkpoint in a fresh process; the digests after each step > K.
Last line: `resume-check: exact`, `resume-check: within atol X (...)` or
`resume-check: differs: first entry E, the runs part at step S at P` (E the first final
entry that differs, P the first entry that parts; a script: `resume-check: differs: first
entry E`; with --json, one JSON object before it); a trainer that raises:
`resume-check: failed: ...`, one line.
Exit status: 0 the runs agree; 1 they differ, the state needs pickle, or the trainer raised;
2 bad input (a factory that does not import, steps out of range, a command without
{steps} or {dir}, two modes or none).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from parity.lab.cli import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    find_users_modules,
    finite_float,
    int_at_least,
)

HELP = "does your trainer resume exactly? N steps straight against k, a save, a fresh process"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("factory", metavar="module:factory", nargs="?",
                   help="the function that builds your trainer, e.g. mytrain:make_trainer")
    p.add_argument("--script", metavar="COMMAND", default=None,
                   help="instead: your training command, with {steps} and {dir} in it")
    p.add_argument("--resume-flag", metavar="FLAG", default=None,
                   help="with --script: the words that make it resume "
                        "(e.g. --resume-flag=--resume)")
    p.add_argument("--state", metavar="FILE", default=None,
                   help="with --script: the file each run saves (default {dir}/ckpt.pt)")
    p.add_argument("--ignore", metavar="ENTRY", action="append", default=None,
                   help="with --script: an entry the runs' own command lines make differ "
                        "(e.g. config.out_dir), left out of the verdict and listed; an "
                        "fnmatch pattern of dotted names; repeatable")
    p.add_argument("--fit", metavar="module:fit", default=None,
                   help="instead: your function training a framework's loop with the "
                        "project's callback (transformers' Trainer, Lightning)")
    p.add_argument("--steps", type=int_at_least(2), required=True, metavar="N",
                   help="steps of the straight run")
    p.add_argument("--at", type=int_at_least(1), required=True, metavar="K",
                   help="the step saved and resumed from (1 <= K < N)")
    p.add_argument("--kill", action="store_true",
                   help="SIGKILL a process while it saves at K + 1; resume from what is left")
    p.add_argument("--atol", type=finite_float(low=0.0), default=None, metavar="X",
                   help="floating entries may differ by up to X (default: bit for bit)")
    p.add_argument("--same-process", action="store_true",
                   help="resume in this process instead of a fresh one")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the text")


def _checked(args: argparse.Namespace) -> str:
    """The mode the arguments ask for ("factory", "script" or "fit"); UsageError when they
    ask for none, for two, or for an option another mode takes."""
    if args.at >= args.steps:
        raise UsageError(f"--at {args.at}: must be below --steps {args.steps}")
    modes = [m for m, v in (("factory", args.factory), ("script", args.script),
                            ("fit", args.fit)) if v is not None]
    if len(modes) != 1:
        raise UsageError("give one of module:factory, --script COMMAND or --fit module:fit"
                         + (f" (got {' and '.join(modes)})" if modes else ""))
    mode = modes[0]
    script_only = [o for o, v in (("--resume-flag", args.resume_flag), ("--state", args.state),
                                  ("--ignore", args.ignore))
                   if v is not None]
    if mode != "script" and script_only:
        raise UsageError(f"{', '.join(script_only)}: only with --script")
    if mode == "script" and args.resume_flag is None:
        raise UsageError("--script needs --resume-flag: the words that make it resume")
    process_only = [o for o, v in (("--kill", args.kill), ("--same-process",
                                                           args.same_process)) if v]
    if mode != "factory" and process_only:
        raise UsageError(f"{', '.join(process_only)}: only with module:factory")
    path = args.factory if mode == "factory" else args.fit
    if mode != "script" and ":" not in path:
        raise UsageError(f"{path!r}: expected module:function (e.g. mytrain:make_trainer)")
    return mode


def run(args: argparse.Namespace) -> int:
    mode = _checked(args)
    find_users_modules()
    from parity.lab.your_trainer.resume_check import ResumeCheckError, TrainerFailed, check_resume

    try:
        if mode == "script":
            from tqdm import tqdm

            from parity.lab.your_trainer.resume_script import RUNS, check_script

            bar: list[tqdm] = []  # drawn once the runs start: a usage error is one line

            def progress(what: str) -> None:  # the runs before this one are done
                if not bar:
                    bar.append(tqdm(total=len(RUNS), desc="resume-check", unit="run",
                                    leave=False))
                bar[0].n = RUNS.index(what)
                bar[0].set_postfix_str(f"{what} run")

            try:
                report = check_script(args.script, resume_flag=args.resume_flag,
                                      state=args.state or "{dir}/ckpt.pt", steps=args.steps,
                                      at=args.at, atol=args.atol, progress=progress,
                                      ignore=tuple(args.ignore or ()))
            finally:
                for b in bar:
                    b.close()
        elif mode == "fit":
            from parity.lab.your_trainer.resume_fit import check_fit

            report = check_fit(args.fit, steps=args.steps, at=args.at, atol=args.atol)
        else:
            report = check_resume(args.factory, steps=args.steps, at=args.at, atol=args.atol,
                                  kill=args.kill, fresh_process=not args.same_process)
    except ResumeCheckError as e:
        raise UsageError(str(e)) from None
    except (TypeError, TrainerFailed) as e:  # a state that needs pickle; a child that raised
        print(f"resume-check: failed: {e}")
        return EXIT_FAILED
    except Exception as e:  # the user's own code raised here: one line, not a traceback
        print(f"resume-check: failed: the trainer raised {type(e).__name__}: {e}")
        return EXIT_FAILED
    if args.json:
        print(json.dumps(dataclasses.asdict(report), indent=1))
        print(report.summary())
    else:
        print(report)
    return EXIT_OK if report.ok else EXIT_FAILED
