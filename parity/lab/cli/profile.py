"""A profiled training run: the prediction sheet written first, then a few steps timed phase
by phase, the bytes at every phase boundary, and every gap between prediction and
measurement beside the term that explains it (or UNEXPLAINED).

    python -m parity profile --impl {reference,torch} [--model {mlp,gpt}] [--device cpu|cuda]
        [--precision {fp32,bf16,fp16}] [--recompute SPEC] [--steps N] [--wait W]
        [--warmup U] [--active A] [--sizes D0,...,DN] [--batch B] [--activation F]
        [--optimizer {SGD,Adam,AdamW}] [--threads T] [--out DIR] [--json]

Order: the machine's rates are probed (a matmul, a copy), the sheet is written to
DIR/predictions.json and predictions.md and its sha256 and time printed; only then is the
model built and measured. The steps run under torch.profiler.schedule(wait, warmup, active)
(a chrome trace of the active steps: DIR/trace.json); the data wait and the host-to-device
copy are timed outside train_step, its forward, backward and optimizer through its phase
hook. CPU: time.perf_counter_ns (kernels finish before their call returns); CUDA:
torch.cuda.synchronize() at every boundary. --impl reference runs the NumPy tree the same
way on the CPU (no profiler, no trace). DIR also gets profile.md (the tables), profile.json,
phases.png and memory.png (with matplotlib, the extra `plot`; without it, profile.md links
no picture and a line on stderr says so). --threads: torch's CPU threads while probing and measuring
(default 1: the default model's tensors are tiny, and on a shared machine a second thread
waits for a core a scheduler tick at a time). NumPy's BLAS threads are fixed when it loads:
run the reference with OPENBLAS_NUM_THREADS=1 (the profile names the setting; BLAS threads
running a GEMM beside the calling thread show as its off-CPU time). --model gpt: train
--model gpt's transformer (--batch sequences of its block size; --sizes and --activation
are the MLP's and refused), --recompute a schedule over its blocks (selective recomputation
is refused: its accountant does not count it); every precision in both trees on the CPU.

Timings are reported, never asserted; bytes are exact. Last line:
`profile: IMPL on DEVICE, step S (median), slowest predicted P / measured M, unexplained
gaps T time + B bytes, predictions sha256 H`.
Exit status: 0; 1 if a byte count at a boundary differs from the formula by no named term;
2 for bad input (unknown device, CUDA without CUDA, --steps below wait + warmup + active).
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from parity.lab.cli import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    int_at_least,
    output_folder,
    pictures_skipped,
)
from parity.lab.cli.account import _sizes

HELP = "profile a few training steps: predictions first, phases, memory, every gap named"
# parity/drivers/profile.py's IMPLS and MODELS, spelled here: the driver imports torch, and
# building the parser (every command's, on every usage error) should not (tests/test_cli.py
# holds the two equal)
IMPLS = ("reference", "torch")
MODELS = ("mlp", "gpt")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impl", choices=IMPLS, required=True)
    p.add_argument("--model", choices=MODELS, default="mlp")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--recompute", default="none", metavar="SPEC",
                   help="none | sqrt | uniform:K | optimal:S (default none)")
    p.add_argument("--steps", type=int_at_least(1), default=30,
                   help="steps run (default 30; at least wait + warmup + active)")
    p.add_argument("--wait", type=int_at_least(0), default=2)
    p.add_argument("--warmup", type=int_at_least(0), default=2)
    p.add_argument("--active", type=int_at_least(1), default=6,
                   help="steps recorded by the profiler and summarized (default 6)")
    p.add_argument("--sizes", type=_sizes, default=None, metavar="D0,...,DN",
                   help="the MLP's widths (default 8,32,32,3; mlp only)")
    p.add_argument("--batch", type=int_at_least(1), default=16,
                   help="rows (mlp) or sequences of the block size (gpt); default 16")
    p.add_argument("--activation", choices=("relu", "tanh", "gelu", "gelu_tanh"),
                   default=None, help="the MLP's activation (default tanh; mlp only)")
    p.add_argument("--optimizer", choices=("SGD", "Adam", "AdamW"), default="AdamW")
    p.add_argument("--threads", type=int_at_least(1), default=1,
                   help="torch's CPU threads while profiling (default 1)")
    p.add_argument("--out", default="profile-out", metavar="DIR",
                   help="the folder for the sheet, the trace and the profile "
                        "(default ./profile-out)")
    p.add_argument("--json", action="store_true",
                   help="print profile.json's object instead of the tables")


def _case(args: argparse.Namespace) -> object:
    from parity.drivers import profile as drv

    if args.device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", args.device):
        raise UsageError(f"--device {args.device!r}: accepted: cpu, cuda, cuda:N")
    if args.device != "cpu" and args.impl == "torch":
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device {args.device}: torch.cuda.is_available() is False "
                             "on this machine; accepted here: cpu")
    if args.model == "gpt":
        given = [f"--{k}" for k in ("sizes", "activation") if getattr(args, k) is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: the MLP's shape; --model gpt profiles "
                             "train --model gpt's transformer (common/gpt_config.py "
                             "TRAIN_SHAPE): accepted with it: --batch, --precision, "
                             "--recompute, --optimizer")
    sizes = (8, 32, 32, 3) if args.sizes is None else args.sizes
    activation = "tanh" if args.activation is None else args.activation
    try:
        return drv.ProfileCase(impl=args.impl, model=args.model, device=args.device,
                               precision=args.precision, recompute=args.recompute,
                               steps=args.steps, wait=args.wait, warmup=args.warmup,
                               active=args.active, sizes=sizes, batch=args.batch,
                               activation=activation, optimizer=args.optimizer,
                               threads=args.threads)
    except ValueError as e:
        raise UsageError(str(e).removeprefix("TrainConfig: ")) from None


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from parity.drivers import profile_measure as meas
    from parity.lab.runners import profile_run, profile_sheet

    case = _case(args)
    out = output_folder(args.out, command=args.command)
    say = (lambda text: print(text, file=sys.stderr)) if args.json else print

    def announce(written: dict) -> None:
        say(f"predictions: {written['path']} sha256 {written['sha256']} written "
            f"{written['written_at']} (before anything is measured)")

    bar = tqdm(total=meas.progress_total(case), desc=f"profile {case.impl}",  # type: ignore[attr-defined]
               unit="step", file=sys.stderr, leave=False)
    try:
        result = profile_run.run_profile(case, out, announce, bar.update)  # type: ignore[arg-type]
    finally:
        bar.close()
    comp = result["comparison"]
    if not result["pictures"]:  # (matplotlib is missing: profile.md links none)
        pictures_skipped(args)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(profile_sheet.profile_markdown(result))
        print(f"written: {', '.join(sorted(p.name for p in out.iterdir()))} in {out}")
    step = next(r for r in comp["time"] if r["phase"] == "step")["measured"]["median"]
    n = comp["unexplained"]
    device = "CPU" if case.device == "cpu" else case.device  # type: ignore[attr-defined]
    say(f"profile: {case.impl} on {device}, step {profile_sheet.seconds(step)} (median), "  # type: ignore[attr-defined]
        f"slowest predicted {result['sheet']['slowest']} / measured "
        f"{profile_sheet.measured_slowest(comp['time'])}, unexplained gaps {n['time']} time "
        f"+ {n['memory']} bytes, predictions sha256 {result['predictions']['sha256']}")
    return EXIT_FAILED if n["memory"] else EXIT_OK
