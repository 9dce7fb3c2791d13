"""`python -m parity train`: the compact model trained with checkpoints; killable, resumable.

    python -m parity train --impl {reference,torch} --steps N --checkpoint-dir DIR
        --checkpoint-every K [--precision {fp32,bf16,fp16}] [--recompute SPEC] [--resume]
        [--seed S] [--dropout P] [--schedule S] [--init-scale S] [--growth-interval G]
        [--keep K] [--device D] [--quiet]

Prints one line per step (step, loss, loss scale, skipped steps) and, as its LAST line,
`state-sha256: <64 hex digits>`: train.state_digest of the final state (NOTE [ Canonical
state digest ] in reference/train.py). A run killed at any moment and restarted with
--resume prints the same digest as an uninterrupted run.
The implementation is imported only when chosen: `--impl reference` never imports torch.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

HELP = "train the compact model with checkpoints; kill it, --resume, same digest"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impl", choices=("reference", "torch"), required=True)
    p.add_argument("--steps", type=int, required=True, help="train until this many steps")
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--checkpoint-every", type=int, default=10, metavar="K")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--recompute", default="none",
                   help="none | sqrt | uniform:K | optimal:S (default none)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest valid checkpoint in --checkpoint-dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--schedule", choices=("constant", "cosine", "step"), default="cosine")
    p.add_argument("--init-scale", type=float, default=2.0**16,
                   help="initial loss scale for fp16 (a huge one forces skipped steps)")
    p.add_argument("--growth-interval", type=int, default=2000,
                   help="steps without overflow before the fp16 scale doubles (default 2000)")
    p.add_argument("--keep", type=int, default=3, help="checkpoints kept (default 3)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--quiet", action="store_true", help="print only the digest line")


def run(args: argparse.Namespace) -> int:
    """Run the training command; return the exit status."""
    if args.steps < 0 or args.checkpoint_every < 0:
        print("train: --steps and --checkpoint-every must be >= 0", file=sys.stderr)
        return 2
    if args.impl == "reference":
        from reference import train as impl

        extra: dict[str, Any] = {}
    else:
        from torch_impl import train as impl

        extra = {"device": args.device}
    try:
        config = impl.TrainConfig(seed=args.seed, precision=args.precision,
                                  recompute=args.recompute, dropout=args.dropout,
                                  schedule=args.schedule, init_scale=args.init_scale,
                                  growth_interval=args.growth_interval)
    except ValueError as e:
        print(f"train: {e}", file=sys.stderr)
        return 2

    def log(line: str) -> None:
        if not args.quiet:
            print(line, flush=True)

    run = impl.train(config, args.steps, args.checkpoint_dir, args.checkpoint_every,
                     resume_from_latest=args.resume, keep=args.keep, log=log, **extra)
    print(f"state-sha256: {impl.state_digest(run.state_dict())}", flush=True)
    return 0
