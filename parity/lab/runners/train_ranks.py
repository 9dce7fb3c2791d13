"""`python -m parity train --world-size N` for N > 1: the options the N-rank run takes, the
refusals of those it cannot, the directory policy (ckpt.commit_policy), then one tree's
run (torch_impl/ddp_train.py: N gloo processes; reference/ddp_train.py: N simulated ranks)
and the same last line as the single-process command, `state-sha256: <64 hex digits>`.

What the N-rank run trains (reference/ddp_train.py has the whole of it): the MLP with SGD
(momentum 0.9) at a constant lr, or the GPT with AdamW under --schedule (cosine by default,
over --horizon) and --recompute; a global batch of BATCH rows split r::N; fp32, bf16 or
fp16, and for the GPT every scaled precision of common/fp8_train.py (DDP or FSDP2) and
bf16-sr (DDP) (each rank scaling from its own shard, fp8-delayed's amaxes reduced with MAX,
the random bits by NOTE [ Random bits on N ranks ]); --loader-workers per rank (--impl
torch). Refused for N > 1, each naming its option and what it takes: a scaled --precision
or bf16-sr for the MLP (the GPT's blocks are what they convert), bf16-sr under --parallel
fsdp (NOTE [ Scaled GEMMs under FSDP2 ] in reference/fsdp_gpt.py), for the MLP a
--recompute other than none, --schedule other than constant and --horizon,
--loader-workers with --impl reference, --check-numerics, --fault/--fault-step, --device
other than cpu, an N that does not divide BATCH. A checkpoint directory of the
single-process command, or of the other tree, is refused (each tree resumes its own commit
records).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from ckpt import CheckpointError, check_config, commit_policy
from common.fp8_train import GPT_PRECISIONS, WEIGHT_PRECISIONS
from common.gpt_config import TRAIN_SHAPE
from common.recompute_plans import split_recompute
from common.train_config import TrainConfig
from parity.lab.cli import EXIT_FAILED, UsageError
from reference.recompute import parse_schedule

BATCH = 24  # rows of the global batch: 1, 2, 3, 4, 6, 8, 12 or 24 ranks split it evenly
PRECISIONS = ("fp32", "bf16", "fp16")  # the autocast ones: ddp_step's and DDP's
SCALED = GPT_PRECISIONS  # the scaled GEMMs and bf16-sr: the GPT (bf16-sr under DDP only)
PAYLOADS = {"dcp": "torch", "npy-records": "reference"}  # a commit record's payload -> --impl


def refusals(args: argparse.Namespace) -> None:
    """UsageError naming the first option the N-rank run cannot take (module docstring)."""
    n = args.world_size
    if args.precision in SCALED and args.model != "gpt":
        raise UsageError(f"--precision {args.precision}: converts the GPT's blocks (--model "
                         f"gpt); --world-size {n} trains the {args.model} in "
                         f"{', '.join(PRECISIONS)}")
    if args.precision in WEIGHT_PRECISIONS and getattr(args, "parallel", "ddp") != "ddp":
        raise UsageError(f"--precision {args.precision}: --world-size {n} trains it under "
                         "--parallel ddp (its AdamWSR over each FSDP2 rank's rows would part "
                         "the one shared bit stream)")
    if args.precision not in (*PRECISIONS, *SCALED):
        raise UsageError(f"--precision {args.precision}: --world-size {n} trains in "
                         f"{', '.join((*PRECISIONS, *SCALED))}")
    if args.model == "mlp":
        if args.recompute != "none":
            raise UsageError(f"--recompute {args.recompute}: --world-size {n} recomputes "
                             "the GPT's blocks (--model gpt); the MLP takes none")
        if args.schedule not in (None, "constant"):
            raise UsageError(f"--schedule {args.schedule}: --world-size {n} trains the MLP "
                             "with SGD at a constant lr (--schedule constant; --model gpt "
                             "takes cosine, step or constant)")
        if args.horizon is not None:
            raise UsageError(f"--horizon: the LR schedule's length; --world-size {n} trains "
                             "the MLP at a constant lr (--model gpt takes one)")
    if args.loader_workers and args.impl == "reference":
        raise UsageError(f"--loader-workers {args.loader_workers}: worker processes are "
                         "--impl torch's; the reference's simulated ranks have none (its "
                         "batch order is the consumed order of any number)")
    if args.check_numerics:
        raise UsageError(f"--check-numerics: the numerics detector watches one process; "
                         f"--world-size {n} has none")
    if args.fault is not None or args.fault_step is not None:
        raise UsageError(f"--fault: the catalogue's faults are seeded into one process; "
                         f"--world-size {n} takes none")
    if args.device is not None and args.device != "cpu":
        raise UsageError(f"--device {args.device}: --world-size {n} runs gloo on the cpu")
    if args.device is not None and args.impl == "reference":
        raise UsageError("--device applies to --impl torch; the reference runs on NumPy")
    async_save = getattr(args, "async_save", None)
    if async_save == "pinned" and args.impl == "reference":
        raise UsageError("--async-save pinned: page-locked staging is torch's; the reference "
                         "stages a NumPy copy (--async-save copy)")
    if async_save is not None and args.impl == "torch":
        from torch_impl.async_ckpt import refusal

        why = refusal(async_save)
        if why is not None:
            raise UsageError(why)
    if BATCH % n:
        raise UsageError(f"--world-size {n}: the global batch of {BATCH} rows does not split "
                         f"into {n} equal shards (1, 2, 3, 4, 6, 8, 12 or 24 ranks)")
    fsdp_refusals(args)


def fsdp_refusals(args: argparse.Namespace) -> None:
    """UsageError for what --parallel fsdp does not take (reference/fsdp_gpt.py's run)."""
    if getattr(args, "parallel", "ddp") != "fsdp":
        return
    if args.model != "gpt":
        raise UsageError(f"--parallel fsdp: shards the GPT (--model gpt), not the {args.model}")


def configuration(args: argparse.Namespace, saved: Mapping[str, Any] | None = None
                  ) -> TrainConfig:
    """The N-rank run's TrainConfig from the command line (`saved`: the configuration of the
    commit it resumes). The MLP's horizon is 1: a constant lr has no schedule length, so
    --steps is not bounded by one and a resumed run may be extended. The GPT's is the
    single-process command's: --horizon, else the resumed run's, else --steps, and --steps
    may not pass it (the schedule would restart)."""
    if args.model == "mlp":
        return TrainConfig(seed=args.seed, model="mlp", precision=args.precision,
                           dropout=args.dropout, optimizer="SGD", schedule="constant",
                           horizon=1, batch_size=BATCH, init_scale=args.init_scale,
                           growth_interval=args.growth_interval)
    inherited = None if saved is None else saved.get("horizon")
    horizon = (args.horizon if args.horizon is not None
               else inherited if isinstance(inherited, int) else args.steps)
    if horizon < args.steps:
        given = "--horizon" if args.horizon is not None else "the horizon the run started with"
        raise UsageError(f"--steps {args.steps} is past {given} {horizon}: the LR schedule "
                         "ends there and would restart (start a new run with a longer "
                         "--horizon)")
    try:  # a spec the blocks cannot take is refused here, before any rank starts
        parse_schedule(split_recompute(args.recompute)[0], TRAIN_SHAPE.n_layer)
    except ValueError as e:
        raise UsageError(f"--recompute {args.recompute}: {e}") from None
    return TrainConfig(seed=args.seed, model="gpt", precision=args.precision,
                       recompute=args.recompute, dropout=args.dropout, optimizer="AdamW",
                       schedule=args.schedule or "cosine", horizon=horizon, batch_size=BATCH,
                       init_scale=args.init_scale, growth_interval=args.growth_interval)


def run(args: argparse.Namespace) -> int:
    """The N-rank command (the module docstring)."""
    refusals(args)
    n = args.world_size
    fsdp = getattr(args, "parallel", "ddp") == "fsdp"
    if args.impl == "reference":
        from reference import ddp_train as impl
        if fsdp:
            from reference import fsdp_gpt as impl  # type: ignore[no-redef]
    else:
        from torch_impl import ddp_train as impl
        if fsdp:
            from torch_impl import fsdp_gpt as impl  # type: ignore[no-redef]

    def notify(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def log(line: str) -> None:
        if not args.quiet:
            print(line, flush=True)

    try:
        start = commit_policy.start(args.checkpoint_dir, impl.PAYLOAD,
                                    resume=args.resume or args.resume_strict,
                                    overwrite=args.overwrite, strict=args.resume_strict,
                                    notify=notify)
    except CheckpointError as e:
        raise UsageError(_named(str(e))) from None
    config = configuration(args, start.config if start.record is not None else None)
    if start.record is not None:
        try:
            check_config(start.config, {**config.to_dict(), **({"parallel": "fsdp"} if fsdp
                                                               else {})},
                         str(start.record.path))
        except CheckpointError as e:
            raise UsageError(str(e)) from None
        was = start.record.world_size
        notify(f"resumed from {start.record.path.name} at step {start.record.step}" + (
            "" if was == n else f" (written by {was} ranks, resharded to {n}: "
            + ("every rank's rows cut anew from the saved ones, " if fsdp else "")
            + "the replicated entries as saved, every rank's stream re-derived from the seed)"))
    if args.impl == "reference":
        from reference.async_ckpt import AsyncSaveError

        try:
            result = impl.train(config, args.steps, n, args.checkpoint_dir,
                                args.checkpoint_every, keep=args.keep, start=start, log=log,
                                **_async(args))
        except AsyncSaveError as e:  # its step is no checkpoint: the commits so far stand
            print(f"train: {e}", file=sys.stderr, flush=True)
            return EXIT_FAILED
    else:
        extra = {"loader_workers": args.loader_workers} if args.loader_workers else {}
        extra.update(_async(args))
        from ranks import DDPError

        try:
            result = impl.train(config, args.steps, n, args.checkpoint_dir,
                                args.checkpoint_every, keep=args.keep, start=start, log=log,
                                **extra)
        except DDPError as e:  # a rank failed or was killed: the commits so far stand
            print(f"train: {e}", file=sys.stderr, flush=True)
            return EXIT_FAILED
    print(f"state-sha256: {result.digest}", flush=True)
    return 0


def _async(args: argparse.Namespace) -> dict[str, str]:
    """--async-save passed on to the tree's train (only when given)."""
    mode = getattr(args, "async_save", None)
    return {} if mode is None else {"async_save": mode}


def _named(message: str) -> str:
    """A payload refusal says which --impl wrote the checkpoint."""
    for payload, impl in PAYLOADS.items():
        message = message.replace(f"payload {payload!r},", f"payload {payload!r} (--impl "
                                                           f"{impl}'s),")
    return message
