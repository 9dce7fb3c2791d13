"""Reference vs torch vs ml_dtypes over float32 inputs: every one of the 2^32 bit patterns
(--exhaustive) or a random sample; exit status 1 on any mismatch beyond the declared
overflow policies. An exhaustive sweep also prints the CPU time of the third library's own
cast (ml_dtypes, or NumPy's astype(float16)) within it, the floor no sweep can go below,
next to the sweep's.

    python -m parity sweep FORMAT [--exhaustive [--record] | --sample N] [--seed S]
                                  [--workers W]
"""

from __future__ import annotations

import argparse
import time

from parity.lab.cli import UsageError, int_at_least
from parity.oracles import SWEEP_FORMATS

HELP = "reference vs torch vs ml_dtypes over float32 inputs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("format", choices=SWEEP_FORMATS)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--exhaustive", action="store_true", help="all 2^32 float32 inputs")
    mode.add_argument("--sample", type=int_at_least(1), default=1 << 24,
                      help="random inputs (default 2^24)")
    p.add_argument("--record", action="store_true",
                   help="with --exhaustive: store the result in docs/data/formats_sweep.json")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--workers", type=int_at_least(1), default=2, help="processes (default 2)")


def run(args: argparse.Namespace) -> int:
    from parity import setting, sweep

    if args.record and not args.exhaustive:
        raise UsageError("--record stores exhaustive sweeps only; add --exhaustive")
    print(setting.pin_torch(), flush=True)  # casts do not depend on it; the claims say it
    start = time.perf_counter()
    if args.exhaustive:
        summary = sweep.sweep_range(args.format, 0, 2**32, workers=args.workers, progress=True)
    else:
        summary = sweep.sweep_sample(args.format, args.sample, seed=args.seed,
                                     workers=args.workers, progress=True)
    seconds = time.perf_counter() - start
    print(sweep.render(summary, seconds))
    if args.record:
        sweep.record(summary, seconds, args.workers)
        print(f"  recorded in {sweep.SWEEP_JSON.name} (python -m parity docs renders it)")
    return 1 if summary.mismatches_torch or summary.mismatches_ml_dtypes else 0
