"""`python -m parity train`: the compact model trained with checkpoints; killable, resumable.

    python -m parity train --impl {reference,torch} --steps N --checkpoint-dir DIR
        [--model {mlp,gpt}] [--checkpoint-every K] [--keep K]
        [--resume | --resume-strict | --overwrite]
        [--precision P] [--recompute SPEC] [--seed S] [--dropout P]
        [--schedule S] [--horizon H] [--init-scale S] [--growth-interval G]
        [--device D] [--loader-workers N] [--quiet] [--check-numerics]
        [--fault NAME|list] [--fault-step K] [--world-size N] [--parallel ddp|fsdp]
        [--async-save [copy|pinned]]

Prints one line per step (step, loss, loss scale, skipped steps) and, as its LAST line,
`state-sha256: <64 hex digits>`: train.state_digest of the final state (NOTE [ Canonical
state digest ] in reference/train.py). A run killed at any moment and restarted with
--resume prints the same digest as an uninterrupted run. What the run does with what the
checkpoint directory already holds is the table in docs/resume.md (ckpt/policy.py); a
refusal is one line on stderr and exit status 2, with nothing in the directory changed (a
directory the run created for it is removed again). What the policy says (nothing to
resume, a checkpoint skipped, kept, removed or renamed aside) and the line naming the
checkpoint a run resumed from go to stderr, --quiet or not; stdout holds the step lines and
the digest. --resume-strict is --resume for scripts: nothing to resume is a refusal.
--model picks what trains (reference/train_models.py): the MLP (the default) or the
compact transformer on the copy task; --recompute takes a schedule over the MLP's layers or
over the transformer's blocks, and for the transformer also "selective" (the attention core
recomputed) or "SPEC+selective". A checkpoint of the other model is refused, naming both.
--precision is an autocast dtype (fp32, bf16, fp16) or, for --model gpt, one of the scaled
GEMM recipes of common/fp8_train.py (fp8-tensorwise, fp8-rowwise, fp8-delayed, mxfp8,
mxfp4, fp8-blockwise-deepseek, -torchao, -te, nvfp4: the blocks' linear layers cast in the
forward and the backward), or bf16-sr (bf16 weights stepped by stochastic rounding, their
random bits common/recipes_train.py's): docs/fp8.md.

With --resume, a checkpoint the OTHER implementation wrote is continued through the
cross-implementation state mapping (torch_impl/resume.py), and the run says so. What
continues exactly: the parameters, optimizer buffers, step counts, lr schedule, loss scale
and data position (the digest at the checkpoint's step is the writer's), and the random bits
of stochastic rounding (one stream in both trees). What does not: the dropout streams
restart from the seed (numpy's and torch's generators cannot be mapped), and
from there the two trees' arithmetic differs within the declared tolerances, so the
trajectory is not bit-equal to either tree's uninterrupted run.

--check-numerics watches every step (reference/numerics.py): each step's line gains the
non-finite, zero and format-view counts of activations and gradients (nan/+inf/-inf/zero/
over_max/to_zero), and the run ends with a table of them per module and parameter. At the
first non-finite value it stops before that step's update, prints the report (step, module,
op, the op's input ranges against the format's limits), writes the step's batch and state
to DIR/first-invalid-step<N>.replay for `python -m parity replay` (the report counts steps
from 0: N is the step printed as `step N+1`), and ends with the line `first-invalid: {json}`
(keys step, phase, module, op, index, value) and exit status 3. A replay file already there
(an earlier run's) is kept: this run's is first-invalid-step<N>-2.replay (-3, ...), and a
line on stderr says so (parity/lab/runners/replay_file.py).
--fault NAME seeds a fault of the catalogue (--fault list: each fault with the model it is
written for; the other model's is refused) after --fault-step K steps: the step printed as
`step K+1` is the first to run with it.
--loader-workers N fetches the batches in N DataLoader worker processes (the torch tree
on cpu): a checkpoint still records the consumed position (NOTE [ Consumed position ] in
reference/data.py), so a killed run resumes to the digest of 0 workers, with any N. The
reference has no worker processes; its batch order is that consumed order.
--world-size N > 1 trains data-parallel on N ranks (gloo processes under DDP for --impl
torch, simulated ranks for --impl reference) with sharded checkpoints committed by record:
parity/lab/runners/train_ranks.py, which refuses the options the N-rank run cannot take,
and docs/distributed.md. --resume in a directory of commit records continues them at any
--world-size, 1 included (then one rank: a one-process launch, or one simulated rank).
--async-save (N ranks) stages a copy and writes it in the background; the record follows
every rank's durable write, the next save waits for it (docs/distributed.md).
The implementation is imported only when chosen: `--impl reference` never imports torch
(unless it converts a torch checkpoint).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from ckpt import CheckpointError
from common.train_config import PRECISIONS
from parity.drivers.resume_cross import converters
from parity.lab.cli import UsageError, finite_float, int_at_least, torch_device
from parity.lab.runners.train_output import RunLength, counts_table, found, steps_title

HELP = "train the MLP or the transformer with checkpoints; kill it, --resume, same digest"
MODELS = ("mlp", "gpt")  # reference/train_models.py (not imported: it imports the model)
F32_MAX = float.fromhex("0x1.fffffep+127")  # the largest finite float32


FAULT_STEP = 3  # --fault-step's default


def _directory(text: str) -> str:
    """An argparse type: a checkpoint directory path (non-empty, not an existing file)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the checkpoint directory is an empty path")
    if os.path.lexists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory")
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impl", choices=("reference", "torch"), required=True,
                   help="which implementation trains (--resume continues either's checkpoint)")
    p.add_argument("--model", choices=MODELS, default="mlp",
                   help="what trains: the MLP (default) or the compact transformer (gpt) on "
                        "the copy task; a checkpoint of the other model is refused")
    p.add_argument("--steps", type=int_at_least(1), required=True,
                   help="train until this many steps in all (a resumed run counts its past)")
    p.add_argument("--checkpoint-dir", type=_directory, required=True,
                   help="where checkpoints go (created if missing, and removed again if "
                        "the run ends before anything is written there)")
    p.add_argument("--checkpoint-every", type=int_at_least(0), default=10, metavar="K",
                   help="write a checkpoint every K steps and after the last step "
                        "(0: only after the last; default 10)")
    p.add_argument("--keep", type=int_at_least(1), default=3, metavar="K",
                   help="checkpoints of this run kept (default 3)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in the directory (says so, on "
                        "stderr, when there is none); one the other --impl wrote continues "
                        "through the state mapping: the state exactly, the random streams "
                        "from the seed, and the trajectory within the trees' tolerances, not "
                        "bit-equal")
    p.add_argument("--resume-strict", action="store_true",
                   help="--resume, but a directory holding no checkpoint (empty, missing, a "
                        "mistyped path) is refused (exit 2, one line on stderr) instead of "
                        "starting at step 0")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh in a directory that holds checkpoints, deleting the "
                        "ones it can read first")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", metavar="PRECISION",
                   help=f"one of {', '.join(PRECISIONS)}: an autocast precision (default "
                        "fp32; fp16 scales the loss), or for --model gpt a scaled-GEMM "
                        "recipe (docs/fp8.md)")
    p.add_argument("--recompute", default="none",
                   help="none | sqrt | uniform:K | optimal:S over the MLP's layers or the "
                        "transformer's blocks; for gpt also selective or SPEC+selective "
                        "(default none)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="in [0, 2^32)")
    p.add_argument("--dropout", type=finite_float(low=0.0, high=1.0, high_open=True),
                   default=0.0, help="in [0, 1) (default 0)")
    p.add_argument("--schedule", choices=("constant", "cosine", "step"), default=None,
                   help="LR schedule over the horizon (default cosine; the MLP on "
                        "--world-size N > 1 takes constant only, and is constant by default)")
    p.add_argument("--horizon", type=int_at_least(1), default=None, metavar="H",
                   help="the LR schedule's length in steps (default: --steps, or on --resume "
                        "the horizon the run started with); part of the configuration")
    p.add_argument("--init-scale", type=finite_float(low=0.0, high=F32_MAX, low_open=True),
                   default=2.0**16,
                   help="initial loss scale for fp16, a finite float32 > 0 (a huge one forces "
                        "skipped steps; default 65536)")
    p.add_argument("--growth-interval", type=int_at_least(1), default=2000,
                   help="steps without overflow before the fp16 scale doubles (default 2000)")
    p.add_argument("--device", default=None,
                   help="torch device: cpu, cuda or cuda:N (--impl torch only; default cpu)")
    p.add_argument("--loader-workers", type=int_at_least(0), default=0, metavar="N",
                   help="DataLoader worker processes fetching the batches (--impl torch only, "
                        "cpu; default 0); the batches, checkpoints and digest are those of 0")
    p.add_argument("--quiet", action="store_true",
                   help="print only the last line to stdout (the digest, or "
                        "first-invalid); the directory's notices still go to stderr")
    p.add_argument("--check-numerics", action="store_true",
                   help="count non-finite values per step; stop at the first one (exit 3), "
                        "writing DIR/first-invalid-step<N>.replay (a name no file has)")
    p.add_argument("--fault", action=_FaultAction, default=None, metavar="NAME",
                   help="seed a fault of the catalogue into the run ('list' lists them)")
    p.add_argument("--fault-step", type=int_at_least(0), default=None, metavar="K",
                   help="seed --fault after K steps: the step printed as 'step K+1' is the "
                        f"first with it (0 to --steps - 1; default {FAULT_STEP}); only with "
                        "--fault (the first-invalid report numbers steps from 0: it names "
                        "that step K)")
    p.add_argument("--world-size", type=int_at_least(1), default=1, metavar="N",
                   help="train data-parallel on N ranks (default 1: this one process). N > 1: "
                        "--impl torch runs N gloo processes under DDP, --impl reference N "
                        "simulated ranks; the MLP with SGD (momentum 0.9) at a constant lr, or "
                        "--model gpt with AdamW under --schedule (default cosine) and "
                        "--recompute; a global batch of 24 rows split r::N (N divides 24), "
                        "fp32/bf16/fp16 (a GradScaler per rank), --loader-workers per rank "
                        "(torch); a sharded checkpoint (commit record) each "
                        "--checkpoint-every. --resume at the same N ends bit for bit as the "
                        "uninterrupted run; at another N it reshards: the replicated state "
                        "as saved, every rank's random stream re-derived from the seed, and "
                        "the steps after are an N-rank run's, not the old one's (N = 1 "
                        "resumes such a directory on one rank). The trees' digests differ "
                        "(their local gradients do, in the last bits). Refused with N > 1: "
                        "the fp8/mx precisions, --check-numerics, --fault, --device other "
                        "than cpu; for the MLP --recompute, --schedule other than constant "
                        "and --horizon")
    p.add_argument("--async-save", nargs="?", const="copy", default=None,
                   choices=("copy", "pinned"), metavar="copy|pinned",
                   help="--world-size N's saves staged by copy and written in the background, "
                        "committed once durable (copy: the default; pinned: torch on CUDA)")
    p.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp",
                   help="--world-size N's split: ddp (default) or fsdp (FSDP2 of --model gpt, "
                        "every precision but bf16-sr, --async-save too, resumed at any N; "
                        "docs/distributed.md)")


class _FaultAction(argparse.Action):
    """--fault NAME, checked against the catalogue; --fault list prints it and exits 0."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from reference.faults import FAULTS

        if values == "list":
            print("".join(f"{f.name} (--model {f.model}): {f.what}\n  fix: {f.fix}\n"
                          for f in FAULTS.values()), end="")
            parser.exit(0)
        if values not in FAULTS:
            parser.error(f"argument --fault: {values!r} is not a fault; the catalogue: "
                         f"{', '.join(FAULTS)} (--fault list describes them)")
        setattr(namespace, self.dest, FAULTS[values])


def configuration(args: argparse.Namespace, impl: Any
                  ) -> Callable[[Mapping[str, Any] | None], Any]:
    """How the run's TrainConfig follows from the configuration saved in the checkpoint it
    resumes (None: a new run, or nothing to resume). train() calls it with the chosen
    checkpoint's, from its one reading of the directory (NOTE [ Choosing before verifying ]
    in ckpt/policy.py), so the model check and the inherited horizon read no file.

    The horizon (the LR schedule's length, part of the configuration) is --horizon if given;
    otherwise, when resuming, the horizon the run started with (so `--resume` with a
    different --steps continues the same run instead of refusing a changed configuration);
    otherwise --steps. A checkpoint of another model is a UsageError (one written before
    --model existed is the MLP's).
    """

    def configure(saved: Mapping[str, Any] | None) -> Any:
        other = None if saved is None else saved.get("model", "mlp")
        if other is not None and other != args.model:
            raise UsageError(f"{args.checkpoint_dir}: its checkpoints are of the model "
                             f"{other!r}, this run trains {args.model!r} (--model {other} "
                             "resumes them; another directory or --overwrite starts afresh)")
        inherited = None if saved is None else saved.get("horizon")
        horizon = (args.horizon if args.horizon is not None
                   else inherited if isinstance(inherited, int) else args.steps)
        if horizon < args.steps:
            given = ("--horizon" if args.horizon is not None
                     else "the horizon the run started with")
            raise UsageError(f"--steps {args.steps} is past {given} {horizon}: the LR schedule "
                             "ends there and would restart; a run cannot be extended past its "
                             "schedule (start a new one with a longer --horizon)")
        return impl.TrainConfig(seed=args.seed, model=args.model, precision=args.precision,
                                recompute=args.recompute, dropout=args.dropout,
                                schedule=args.schedule or "cosine", horizon=horizon,
                                init_scale=args.init_scale,
                                growth_interval=args.growth_interval)

    return configure


def run(args: argparse.Namespace) -> int:
    """Run the training command; return the exit status. The configuration is settled by
    `configuration` inside train(), which builds the one Run (refusing a recompute spec the
    model cannot take) and, on --resume, loads the chosen checkpoint into it."""
    committed = os.path.isdir(args.checkpoint_dir) and any(
        n.startswith("COMMITTED-") for n in os.listdir(args.checkpoint_dir))
    resuming = committed and (args.resume or args.resume_strict)
    if args.parallel != "ddp" and args.world_size == 1 and not resuming:
        raise UsageError(f"--parallel {args.parallel}: shards over N > 1 ranks; give "
                         "--world-size N (or resume an N-rank commit on 1)")
    if args.world_size > 1 or resuming:
        from parity.lab.runners import train_ranks  # N ranks (or 1, resuming N's commits)

        return train_ranks.run(args)
    if args.async_save is not None:
        raise UsageError(f"--async-save {args.async_save}: the sharded checkpoints of "
                         "--world-size N are saved in the background; the one-process "
                         "checkpoint is written in place (give --world-size N)")
    if committed:
        raise UsageError(f"{args.checkpoint_dir} holds commit records of an N-rank run "
                         "(--world-size N --resume continues them, N = 1 included): choose "
                         "another directory")
    if args.fault is None and args.fault_step is not None:
        raise UsageError(f"--fault-step {args.fault_step} places a seeded fault: it needs "
                         "--fault NAME (--fault list shows them)")
    if args.fault is not None:  # (another model's fault first: no step can make it fit)
        from common.fault_catalogue import check_model as fault_fits

        try:
            fault_fits(args.fault, args.model)
        except ValueError as e:
            raise UsageError(f"--fault {args.fault.name}: {e}") from None
    fault_step = FAULT_STEP if args.fault_step is None else args.fault_step
    if args.fault is not None and fault_step >= args.steps:
        raise UsageError(f"--fault-step {fault_step}: the fault would be seeded after "
                         f"{fault_step} steps, before the line 'step {fault_step + 1}', and this "
                         f"run ends at 'step {args.steps}': it would never strike; accepted: 0 "
                         f"to {args.steps - 1}")
    extra: dict[str, Any] = {}
    if args.impl == "reference":
        if args.device is not None:
            raise UsageError("--device applies to --impl torch; the reference runs on NumPy")
        if args.loader_workers:
            raise UsageError("--loader-workers applies to --impl torch; the reference has no "
                             "worker processes (its batch order is the consumed order of any N)")
        from reference import train as impl
    else:
        extra["device"] = torch_device(args.device or "cpu")
        if args.loader_workers and extra["device"].type != "cpu":
            raise UsageError(f"--loader-workers {args.loader_workers}: worker processes index "
                             "the task on the cpu; with --device cuda use 0")
        extra["loader_workers"] = args.loader_workers
        from torch_impl import train as impl

    def notify(line: str) -> None:  # what scripts must not mistake for the digest's company
        print(line, file=sys.stderr, flush=True)

    eta = RunLength(args.steps, notify)

    def log(line: str) -> None:
        eta.step(line)
        if not args.quiet:
            print(line, flush=True)

    from common.numerics_report import NonFinite

    try:
        result = impl.train(configuration(args, impl), args.steps, args.checkpoint_dir,
                            args.checkpoint_every,
                            resume_from_latest=args.resume or args.resume_strict,
                            strict=args.resume_strict, notify=notify,
                            overwrite=args.overwrite, keep=args.keep, log=log,
                            foreign=converters(args.impl),
                            check_numerics=args.check_numerics, fault=args.fault,
                            fault_step=fault_step, **extra)
    except CheckpointError as e:
        raise UsageError(str(e)) from None
    except ValueError as e:  # a configuration or recompute spec refused, a misplaced fault
        raise UsageError(str(e)) from None
    except NonFinite as e:
        return found(args, e)
    if result.numerics is not None and not args.quiet:
        history = result.numerics.history
        print(counts_table(history, steps_title(history, result.step)))
    print(f"state-sha256: {impl.state_digest(result.state_dict())}", flush=True)
    return 0
