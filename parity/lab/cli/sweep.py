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
import os
import time

from parity.lab.cli import UsageError, int_at_least

HELP = "reference vs torch vs ml_dtypes over float32 inputs"
# parity/oracles.py's SWEEP_FORMATS, spelled here: it imports ml_dtypes (most of a second),
# which building the parser, for every command, should not (tests/test_cli.py holds them equal)
SWEEP_FORMATS = ("float16", "bfloat16", "float8_e5m2", "float8_e4m3fn", "float8_e4m3fnuz",
                 "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e8m0fnu", "float6_e2m3fn",
                 "float6_e3m2fn", "float4_e2m1fn", "float8_e4m3", "float8_e3m4")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("format", choices=SWEEP_FORMATS)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--exhaustive", action="store_true", help="all 2^32 float32 inputs")
    mode.add_argument("--sample", type=int_at_least(1), default=1 << 24,
                      help="random inputs (default 2^24)")
    p.add_argument("--record", action="store_true",
                   help="with --exhaustive: store the result in docs/data/formats_sweep.json")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--workers", type=int_at_least(1), default=None,
                   help="processes (default 2, or the CPUs if fewer; at most the CPUs)")


def run(args: argparse.Namespace) -> int:
    from parity import setting, sweep

    if args.record and not args.exhaustive:
        raise UsageError("--record stores exhaustive sweeps only; add --exhaustive")
    if args.sample > 2**32:
        raise UsageError(f"--sample {args.sample}: there are 2^32 = 4,294,967,296 float32 "
                         "inputs; for all of them use --exhaustive")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    if args.workers is None:
        args.workers = min(2, cpus)
    if args.workers > cpus:
        raise UsageError(f"--workers {args.workers}: this machine gives the process {cpus} "
                         f"CPUs, and more processes than CPUs only wait; accepted: 1 to {cpus}")
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
        print(f"  recorded in {sweep.SWEEP_JSON.name} ({args.prog} docs renders it)")
    return 1 if summary.mismatches_torch or summary.mismatches_ml_dtypes else 0
