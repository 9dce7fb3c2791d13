"""`python -m parity train --world-size N` for N > 1: the options the N-rank run takes, the
refusals of those it cannot, the directory policy (ckpt.commit_policy), then one tree's
run (torch_impl/ddp_train.py: N gloo processes; reference/ddp_train.py: N simulated ranks)
and the same last line as the single-process command, `state-sha256: <64 hex digits>`.

What the N-rank run trains (reference/ddp_train.py has the whole of it): the MLP, SGD with
momentum 0.9 at a constant lr, a global batch of BATCH rows split r::N, fp32, bf16 or fp16.
Refused for N > 1, each naming its option: --model gpt, a scaled-GEMM --precision, a
--recompute other than none, --schedule other than constant, --horizon, --loader-workers,
--check-numerics, --fault/--fault-step, --device other than cpu, an N that does not divide
BATCH. A checkpoint directory of the single-process command, or of the other tree, is
refused (each tree resumes its own commit records).
"""

from __future__ import annotations

import argparse
import sys

from ckpt import CheckpointError, check_config, commit_policy
from common.train_config import TrainConfig
from parity.lab.cli import EXIT_FAILED, UsageError

BATCH = 24  # rows of the global batch: 1, 2, 3, 4, 6, 8, 12 or 24 ranks split it evenly
PRECISIONS = ("fp32", "bf16", "fp16")  # the autocast ones: ddp_step's and DDP's
PAYLOADS = {"dcp": "torch", "npy-records": "reference"}  # a commit record's payload -> --impl


def refusals(args: argparse.Namespace) -> None:
    """UsageError naming the first option the N-rank run cannot take (module docstring)."""
    n = args.world_size
    if args.model != "mlp":
        raise UsageError(f"--model {args.model}: --world-size {n} trains the MLP (--model mlp)")
    if args.precision not in PRECISIONS:
        raise UsageError(f"--precision {args.precision}: --world-size {n} trains in "
                         f"{', '.join(PRECISIONS)} (the scaled GEMMs are single-process)")
    if args.recompute != "none":
        raise UsageError(f"--recompute {args.recompute}: --world-size {n} does not recompute")
    if args.schedule not in (None, "constant"):
        raise UsageError(f"--schedule {args.schedule}: --world-size {n} trains SGD at a "
                         "constant lr (--schedule constant)")
    if args.horizon is not None:
        raise UsageError(f"--horizon: the LR schedule's length; --world-size {n} trains at a "
                         "constant lr")
    if args.loader_workers:
        raise UsageError(f"--loader-workers {args.loader_workers}: --world-size {n} reads "
                         "the global batch in each rank's process (0 workers)")
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
    if BATCH % n:
        raise UsageError(f"--world-size {n}: the global batch of {BATCH} rows does not split "
                         f"into {n} equal shards (1, 2, 3, 4, 6, 8, 12 or 24 ranks)")


def configuration(args: argparse.Namespace) -> TrainConfig:
    """The N-rank run's TrainConfig from the command line. Its horizon is 1: a constant lr
    has no schedule length, so --steps is not bounded by one and a resumed run may be
    extended (the single-process command's horizon inheritance has nothing to do here)."""
    return TrainConfig(seed=args.seed, model="mlp", precision=args.precision,
                       dropout=args.dropout, optimizer="SGD", schedule="constant", horizon=1,
                       batch_size=BATCH, init_scale=args.init_scale,
                       growth_interval=args.growth_interval)


def run(args: argparse.Namespace) -> int:
    """The N-rank command (the module docstring)."""
    refusals(args)
    n = args.world_size
    if args.impl == "reference":
        from reference import ddp_train as impl
    else:
        from torch_impl import ddp_train as impl

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
    config = configuration(args)
    if start.record is not None:
        try:
            check_config(start.config, config.to_dict(), str(start.record.path))
        except CheckpointError as e:
            raise UsageError(str(e)) from None
        was = start.record.world_size
        notify(f"resumed from {start.record.path.name} at step {start.record.step}" + (
            "" if was == n else f" (written by {was} ranks, resharded to {n}: the replicated "
            "entries as saved, every rank's stream re-derived from the seed)"))
    if args.impl == "reference":
        result = impl.train(config, args.steps, n, args.checkpoint_dir, args.checkpoint_every,
                            keep=args.keep, start=start, log=log)
    else:
        from ranks import DDPError

        try:
            result = impl.train(config, args.steps, n, args.checkpoint_dir,
                                args.checkpoint_every, keep=args.keep, start=start, log=log)
        except DDPError as e:  # a rank failed or was killed: the commits so far stand
            print(f"train: {e}", file=sys.stderr, flush=True)
            return EXIT_FAILED
    print(f"state-sha256: {result.digest}", flush=True)
    return 0


def _named(message: str) -> str:
    """A payload refusal says which --impl wrote the checkpoint."""
    for payload, impl in PAYLOADS.items():
        message = message.replace(f"payload {payload!r},", f"payload {payload!r} (--impl "
                                                           f"{impl}'s),")
    return message
