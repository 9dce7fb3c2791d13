"""What each bf16-weight optimizer buys: the compact GPT trained with bf16 weights and no fp32
master copy, against the same model trained in fp32.

    python benchmarks/bf16_optim.py [--steps 400] [--lr 1e-3] [--compute fp32|bf16]

Runs (torch_impl, CPU, one thread), all from the same fp32 init (the bf16 runs from its bf16
rounding), on the same batches of the copy task (vocab 12, 8 digits, batch 32), AdamW with
betas (0.9, 0.999), eps 1e-8, no weight decay:
- fp32 AdamW        torch.optim.AdamW on float32 weights: the master run
- bf16 nearest      torch_impl.optim_kahan.AdamWKahan(kahan=False): each new weight rounded
                    to nearest (AnyPrecisionAdamW's moments: m float32, v bf16)
- bf16 torch AdamW  torch.optim.AdamW on bf16 weights (every state entry bf16, nearest)
- bf16 SR           torch_impl.optim_sr.AdamWSR, draws from a torch.Generator seeded 0
- bf16 Kahan        torch_impl.optim_kahan.AdamWKahan (AnyPrecisionAdamW's rule)
`--compute fp32` (default): forward and backward in float32 on the bf16 weights' values,
the gradients rounded to bf16 for the optimizer, so the runs differ in the optimizer only;
`--compute bf16`: the model itself in bf16 (pure bf16 training).

Printed at a few steps, side by side: each run's relative drift from the fp32 run,
||w - w32|| / ||w32|| over every weight (float64), and its training loss (the same batch for
every run); then the share of bf16 weights that never left their initial value. No asserts:
a measurement (the claims are in parity/test_optim_kahan.py and parity/test_optim_sr.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from common.gpt_config import GPTConfig  # noqa: E402
from torch_impl import data as tdata  # noqa: E402
from torch_impl.gpt import GPT  # noqa: E402
from torch_impl.optim_kahan import AdamWKahan  # noqa: E402
from torch_impl.optim_sr import AdamWSR  # noqa: E402

CONFIG = GPTConfig()  # the tiny default: vocab 12, block 16, 2 layers, 2 heads, width 32
PREFIX, SAMPLES, BATCH, SEED = 8, 4096, 32, 1
RUNS = ("fp32 AdamW", "bf16 nearest", "bf16 torch AdamW", "bf16 SR", "bf16 Kahan")


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The copy task's first `steps` batches, in the resumable sampler's order."""
    task = tdata.make_copy_task(SEED, SAMPLES, prefix=PREFIX, vocab_size=CONFIG.vocab_size)
    loader = tdata.make_loader(task, tdata.ResumableSampler(SAMPLES, SEED), BATCH,
                               drop_last=True, generator=torch.Generator())
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    while len(out) < steps:
        out.extend(loader)
    return out[:steps]


def train(run: str, data: list, lr: float, compute: str, at: list[int]
          ) -> tuple[dict[int, list[torch.Tensor]], dict[int, float], float]:
    """One run: its weights (float32 copies) and loss at the steps `at`, and its seconds."""
    model = GPT(CONFIG, generator=torch.Generator().manual_seed(0))
    hyper = {"lr": lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    if run == "fp32 AdamW":
        weights = list(model.parameters())
    elif compute == "bf16":
        model.to(torch.bfloat16)
        weights = list(model.parameters())
    else:  # float32 compute on the bf16 weights' values
        weights = [torch.nn.Parameter(p.detach().bfloat16()) for p in model.parameters()]
    if run in ("fp32 AdamW", "bf16 torch AdamW"):
        opt = torch.optim.AdamW(weights, **hyper)
    elif run == "bf16 SR":
        opt = AdamWSR(weights, **hyper)
        draws = torch.Generator().manual_seed(0)
    else:
        opt = AdamWKahan(weights, kahan=run == "bf16 Kahan", **hyper)
    shadow = weights[0] is not next(model.parameters())  # float32 compute, bf16 weights
    seen: dict[int, list[torch.Tensor]] = {0: [w.detach().float().clone() for w in weights]}
    losses: dict[int, float] = {}
    start = time.perf_counter()
    for step, (idx, labels) in enumerate(data, start=1):
        if shadow:
            with torch.no_grad():
                for p, w in zip(model.parameters(), weights, strict=True):
                    p.copy_(w)  # bf16 -> float32, exact
        model.zero_grad(set_to_none=True)
        _, loss = model(idx, labels)
        loss.backward()
        if shadow:
            for p, w in zip(model.parameters(), weights, strict=True):
                w.grad = p.grad.bfloat16()
        if run == "bf16 SR":
            opt.step([torch.randint(0, 1 << 16, w.shape, dtype=torch.int32, generator=draws)
                      for w in weights])
        else:
            opt.step()
        if step in at:
            seen[step] = [w.detach().float().clone() for w in weights]
            losses[step] = loss.detach().item()
    return seen, losses, time.perf_counter() - start


def drift(w: list[torch.Tensor], w32: list[torch.Tensor]) -> float:
    """||w - w32|| / ||w32|| over every weight, in float64."""
    a = torch.cat([x.double().reshape(-1) for x in w])
    b = torch.cat([x.double().reshape(-1) for x in w32])
    return float((a - b).norm() / b.norm())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--compute", choices=("fp32", "bf16"), default="fp32")
    args = ap.parse_args(argv)
    if args.steps < 1 or not args.lr > 0:
        ap.error("--steps must be >= 1 and --lr > 0")
    torch.set_num_threads(1)
    at = sorted({s for s in (10, 25, 50, 100, 200, 400, 800, 1600) if s < args.steps}
                | {args.steps})
    data = batches(args.steps)
    results = {run: train(run, data, args.lr, args.compute, at) for run in RUNS}
    w32 = results["fp32 AdamW"][0]
    print(f"compact GPT {CONFIG.n_layer} layers, width {CONFIG.n_embd}, "
          f"{sum(x.numel() for x in w32[0])} weights; copy task, batch {BATCH}, lr {args.lr}, "
          f"{args.compute} compute; torch {torch.__version__}")
    print("\nrelative drift from the fp32 run, ||w - w32|| / ||w32||")
    print(f"{'step':>6} " + " ".join(f"{run:>17}" for run in RUNS[1:]))
    for s in at:
        print(f"{s:>6} " + " ".join(f"{drift(results[run][0][s], w32[s]):>17.3e}"
                                     for run in RUNS[1:]))
    print("\ntraining loss (the same batch in every run)")
    print(f"{'step':>6} " + " ".join(f"{run:>17}" for run in RUNS))
    for s in at:
        print(f"{s:>6} " + " ".join(f"{results[run][1][s]:>17.4f}" for run in RUNS))
    print("\nweights still at their initial value at the end, and seconds per run")
    for run in RUNS:
        seen, _, seconds = results[run]
        first, last = seen[0], seen[args.steps]
        same = sum(int((a == b).sum()) for a, b in zip(first, last, strict=True))
        total = sum(a.numel() for a in first)
        print(f"{run:>17}: {same / total:7.2%} unmoved   {seconds:6.1f} s")


if __name__ == "__main__":
    main()
