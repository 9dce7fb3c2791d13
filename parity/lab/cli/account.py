"""The prediction sheet of one training step: bytes per category, FLOPs per phase, bytes per
parameter; with --measure, the same step run in both trees, each measurement beside the
prediction with the gap and the term that explains it.

    python -m parity account --model mlp [--sizes 8,32,32,3] [--batch 16] [--activation A]
        [--dropout P] [--precision {fp32,bf16,fp16}] [--optimizer O] [--recompute SPEC]
        [--no-early-stop] [--measure] [--device D] [--json]
    python -m parity account --model gpt [--n-layer 12] [--d-model 768] [--n-head 12]
        [--seq-len 1024] [--block-size N] [--vocab 50257] [--batch 8] [--d-ff F] [--no-bias]
        [--tie-weights] [--dropout P] [--precision {fp32,bf16,fp16,bf16_mixed,fp16_mixed}]
        [--optimizer O] [--recompute {none,full,full_early_stop}] [--measure] [--json]

--precision: fp32, bf16, fp16 are this project's (autocast over float32 weights); bf16_mixed
and fp16_mixed hold the weights in 2 bytes with a float32 master copy (gpt's sheet only).
--optimizer: sgd, sgd_momentum, adam, adamw. --recompute: a checkpoint schedule for the MLP
(none, sqrt, uniform:K, optimal:S), whole blocks for gpt (full re-runs every block's forward;
full_early_stop is torch's non-reentrant checkpoint, which stops before the last GEMM).
The gpt sheet has Korthikanti's activation row beside the exact one of this project's block
(gpt_activation_bytes, for fp32, bf16, fp16). `--model gpt --measure` runs one train_step of
the compact transformer (torch: each block checkpointed for full / full_early_stop; the
reference: its tape in fp32 without recompute, its state always) on the CPU; it refuses
--d-ff, --no-bias, the *_mixed precisions and steps whose predicted bytes exceed
--measure-limit (default 2 GiB), each with a one-line reason.

    python -m parity account --module PKG.MOD:FACTORY [--batch-shape B,T] [--optimizer O]
        [--json]

--module: any nn.Module. FACTORY() (or FACTORY(batch_shape=(B, T)) with --batch-shape)
returns (model, example_batch) or (model, example_batch, loss_fn); one step is measured per
module path (parity/lab/your_trainer/accounting_any.py) and a GPT-2-shaped model is set
beside the closed forms, each difference a named term (parity/lab/account_any.py).
Last line: `account: memory B bytes (state S, P bytes/param), flops F, unexplained gaps U`
(with --json, the one JSON object holds the same: totals, unexplained).
Exit status: 0; 1 if --measure finds a gap no named term explains; 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import re

from parity.lab.cli import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    find_users_modules,
    finite_float,
    int_at_least,
)

HELP = "predict bytes and FLOPs of one step; --measure reconciles both trees term by term"


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers "
                                         "(e.g. 8,32,32,3)") from None
    if len(sizes) < 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: needs at least two positive widths "
                                         "(d_in,...,d_out)")
    return sizes


def _batch_shape(text: str) -> tuple[int, int]:
    """--batch-shape B,T: exactly two positive integers (the factory is called with
    batch_shape=(B, T))."""
    parts = text.split(",")
    if len(parts) != 2 or not all(re.fullmatch(r"\s*\d+\s*", part) for part in parts) or (
            min(int(part) for part in parts) < 1):
        raise argparse.ArgumentTypeError(f"{text!r}: expected B,T, two positive integers "
                                         "(the factory gets batch_shape=(B, T); e.g. 2,8)")
    return int(parts[0]), int(parts[1])


# parity/drivers/accounting.py's MODELS, OPTIMIZERS' names and PRECISIONS, spelled here: the
# driver imports torch, and building the parser should not (tests/test_cli.py holds them equal)
MODELS = ("mlp", "gpt")
OPTIMIZERS = ("sgd", "sgd_momentum", "adam", "adamw")
PRECISIONS = ("fp32", "bf16", "fp16", "bf16_mixed", "fp16_mixed")


def add_arguments(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", choices=MODELS)
    which.add_argument("--module", metavar="PKG.MOD:FACTORY",
                       help="any nn.Module: FACTORY() returns (model, example_batch[, loss_fn])")
    p.add_argument("--batch-shape", type=_batch_shape, default=None, metavar="B,T",
                   help="--module: passed to the factory as batch_shape=(B, T)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument("--recompute", default="none", metavar="SPEC",
                   help="mlp: none | sqrt | uniform:K | optimal:S; gpt: none | full | "
                        "full_early_stop (default none)")
    p.add_argument("--batch", type=int_at_least(1), default=None,
                   help="rows (mlp, default 16) or sequences (gpt, default 8)")
    p.add_argument("--dropout", type=finite_float(low=0.0, high=1.0), default=0.0)
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.add_argument("--measure", action="store_true",
                   help="run one step in both trees and reconcile")
    p.add_argument("--device", default="cpu",
                   help="torch device for --measure (cpu, cuda; gpt: cpu)")
    mlp = p.add_argument_group("mlp")
    mlp.add_argument("--sizes", type=_sizes, default=(8, 32, 32, 3), metavar="D0,...,DN")
    mlp.add_argument("--activation", choices=("relu", "tanh", "gelu", "gelu_tanh"),
                     default="tanh")
    mlp.add_argument("--no-early-stop", action="store_true",
                     help="torch.utils.checkpoint.set_checkpoint_early_stop(False)")
    gpt = p.add_argument_group("gpt")
    gpt.add_argument("--n-layer", type=int_at_least(1), default=12)
    gpt.add_argument("--d-model", type=int_at_least(1), default=768)
    gpt.add_argument("--n-head", type=int_at_least(1), default=12)
    gpt.add_argument("--seq-len", type=int_at_least(1), default=1024)
    gpt.add_argument("--block-size", type=int_at_least(1), default=None,
                     help="rows of the position table, at least --seq-len (default seq-len)")
    gpt.add_argument("--measure-limit", type=int_at_least(1), default=2 * 2**30,
                     metavar="BYTES", help="--measure refuses a gpt step predicted larger")
    gpt.add_argument("--vocab", type=int_at_least(1), default=50257)
    gpt.add_argument("--d-ff", type=int_at_least(1), default=None, help="default 4 d_model")
    gpt.add_argument("--no-bias", action="store_true")
    gpt.add_argument("--tie-weights", action="store_true")


def _case(args: argparse.Namespace) -> object:
    from parity.drivers import accounting as drv

    if args.model == "mlp":
        if args.precision not in ("fp32", "bf16", "fp16"):
            raise UsageError(f"--precision {args.precision}: the MLP trains under autocast in "
                             "this project; accepted for --model mlp: fp32, bf16, fp16")
        return drv.MLPCase(sizes=args.sizes, batch=args.batch or 16,
                           activation=args.activation, dropout=args.dropout,
                           precision=args.precision, optimizer=args.optimizer,
                           recompute=args.recompute, early_stop=not args.no_early_stop)
    if args.block_size is not None and args.block_size < args.seq_len:
        raise UsageError(f"--block-size {args.block_size} is below --seq-len {args.seq_len}: "
                         "accepted: block_size >= seq_len")
    return drv.GPTCase(n_layer=args.n_layer, d_model=args.d_model, n_head=args.n_head,
                       seq_len=args.seq_len, block_size=args.block_size,
                       vocab=args.vocab, batch=args.batch or 8,
                       d_ff=args.d_ff, bias=not args.no_bias, tie_weights=args.tie_weights,
                       dropout=args.dropout, precision=args.precision,
                       optimizer=args.optimizer, recompute=args.recompute)


def _number(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def render(rows: list, trees: tuple[str, ...]) -> str:
    """The sheet as a plain-text table; with trees, measured | gap | term per tree."""
    head = ["section", "quantity", "predicted"]
    for tree in trees:
        head += [tree, "gap", "term"]
    head.append("formula")
    body = []
    for r in rows:
        line = [r.section, r.name, _number(r.predicted)]
        for tree in trees:
            gap = r.gap(tree)
            line += [_number(r.measured.get(tree)), _number(gap) if gap else "",
                     r.terms.get(tree, "")]
        body.append([*line, r.formula])
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    right = {i for i, h in enumerate(head) if h in ("predicted", "gap", *trees)}
    fmt = lambda row: "  ".join(v.rjust(w) if i in right else v.ljust(w)  # noqa: E731
                                for i, (v, w) in enumerate(zip(row, widths, strict=True)))
    lines = [fmt(head), fmt(["-" * w for w in widths]), *map(fmt, body)]
    return "\n".join(line.rstrip() for line in lines)


def run_module(args: argparse.Namespace) -> int:
    """--module: measure the factory's model; reconcile it when it is GPT-2-shaped."""
    find_users_modules()  # the factory's module, from the current folder as resume-check
    from parity.lab import account_any

    try:
        report = account_any.module_report(args.module, args.batch_shape, args.optimizer)
    except (ValueError, TypeError, ImportError) as e:  # the factory's, or its model's
        raise UsageError(f"--module {args.module}: {e}" if args.module not in str(e)
                         else str(e)) from None
    t = report["totals"]
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(account_any.render_report(report))
        print(f"account: memory {t['memory']} bytes (params {t['params']}, activations "
              f"{t['activations']}), flops {t['flops']}, unexplained gaps "
              f"{report['unexplained']}")
    return EXIT_FAILED if report["unexplained"] else EXIT_OK


def run(args: argparse.Namespace) -> int:
    from parity.drivers import accounting as drv
    from parity.drivers import accounting_gpt as dgpt

    if args.module is not None:
        return run_module(args)
    if args.batch_shape is not None:
        raise UsageError("--batch-shape goes with --module (the factory's batch); accepted "
                         "for --model: --batch, --seq-len")
    case = _case(args)
    if args.device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", args.device):
        raise UsageError(f"--device {args.device!r}: accepted: cpu, cuda, cuda:N")
    try:
        rows = drv.predict_mlp(case, args.device) if args.model == "mlp" else \
            dgpt.gpt_sheet(case)  # type: ignore[arg-type]
    except ValueError as e:
        raise UsageError(str(e)) from None
    trees: tuple[str, ...] = ()
    cuda = None
    if args.measure and args.model == "gpt":
        if args.device != "cpu":
            raise UsageError(f"--device {args.device}: --model gpt --measure runs on the CPU "
                             "(its exact activations are modelled for CUDA in fp32 only); "
                             "accepted: cpu")
        try:
            dgpt.config_of(case)  # type: ignore[arg-type]
        except ValueError as e:
            raise UsageError(f"--measure: {e}") from None
        size = drv.totals(rows, case.n_params)["memory"]  # type: ignore[attr-defined]
        if size > args.measure_limit:
            raise UsageError(f"--measure: the step is predicted to hold {size:,} bytes, above "
                             f"--measure-limit {args.measure_limit:,}; accepted: smaller "
                             "sizes or a larger --measure-limit")
        dgpt.reconcile_gpt(rows, case, dgpt.torch_gpt_step(case),  # type: ignore[arg-type]
                           dgpt.reference_gpt_step(case))  # type: ignore[arg-type]
        trees = ("torch", "reference")
    if args.measure and args.model == "mlp":
        if args.device != "cpu":
            import torch

            if not torch.cuda.is_available():
                raise UsageError(f"--device {args.device}: torch.cuda.is_available() is False")
        measured = drv.torch_step(case, args.device)  # type: ignore[arg-type]
        drv.reconcile(rows, case, measured, drv.reference_step(case))  # type: ignore[arg-type]
        trees, cuda = ("torch", "reference"), measured["cuda"]
    unexplained = sum(term == "UNEXPLAINED" for r in rows for term in r.terms.values())
    t = drv.totals(rows, case.n_params)  # type: ignore[attr-defined]
    if args.json:
        out = drv.as_json(args.model, case, rows)  # type: ignore[arg-type]
        out.update(unexplained=unexplained, cuda=cuda)
        print(json.dumps(out, indent=1))
    else:
        print(render(rows, trees))
        if cuda:
            print("\nCUDA memory by phase (bytes; allocated at start and end, peak, reserved):")
            for phase, stats in cuda.items():
                print(f"  {phase:<10} " + "  ".join(f"{k} {v:,}" for k, v in stats.items()))
            grew = cuda["forward"]["end"] - cuda["forward"]["start"]
            saved = sum(r.measured["torch"] or 0 for r in rows if r.name.startswith("activ"))
            print(f"  the forward left {grew:,} bytes allocated for {saved:,} saved: the gap is "
                  "each allocation rounded up to 512 bytes, the outputs, and cuBLAS's "
                  "workspace at the first GEMM (kept); reserved - allocated is the cache")
        if trees and args.model == "gpt":
            print(f"\nreference: {dgpt.REFERENCE_GPT_LIMITS}; its forward FLOPs are its "
                  "tape's own count")
    if not args.json:
        print(f"account: memory {t['memory']} bytes (state {t['state']}, "
              f"{t['bytes_per_param']} bytes/param), flops {t['flops']}, "
              f"unexplained gaps {unexplained}")
    return EXIT_FAILED if unexplained else EXIT_OK
