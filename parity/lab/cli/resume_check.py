"""Resume equivalence of your own trainer: N steps straight against k steps, a save, a fresh
process, a load and N - k steps; every entry of the final states compared bit for bit (or
within --atol), the first that differs named, and the step at which the two runs part.

    python -m parity resume-check module:factory --steps N --at K [--kill] [--atol X]
        [--same-process] [--json]

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
Last line: `resume-check: exact`, `resume-check: within atol X (...)` or
`resume-check: differs: first entry E, the runs part at step S at P` (E the first final
entry that differs, P the first entry that parts; with --json, one JSON
object before it); a trainer that raises: `resume-check: failed: ...`, one line.
Exit status: 0 the runs agree; 1 they differ, the state needs pickle, or the trainer raised;
2 bad input (a factory that does not import, steps out of range).
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
    p.add_argument("factory", metavar="module:factory",
                   help="the function that builds your trainer, e.g. mytrain:make_trainer")
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


def run(args: argparse.Namespace) -> int:
    if args.at >= args.steps:
        raise UsageError(f"--at {args.at}: must be below --steps {args.steps}")
    if ":" not in args.factory:
        raise UsageError(f"{args.factory!r}: expected module:function (e.g. "
                         "mytrain:make_trainer)")
    find_users_modules()
    from parity.lab.your_trainer.resume_check import ResumeCheckError, TrainerFailed, check_resume

    try:
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
