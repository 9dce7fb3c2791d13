"""The GPT with AdamW under DDP in both trees: one launch of gloo processes (torch_impl's
ddp_jobs.gpt_job, the real engine) and the reference's simulated ranks
(reference/ddp_gpt.py's ddp_step) replaying what the launch recorded, as parity/drivers/
ddp.py does for the MLP: the same batches, the torch run's initial parameters and, at every
step, the torch ranks' local gradients in place of the reference's own (the two trees'
local gradients differ in the last bits: BLAS orders, claim nn.linear). What is then
compared is the buckets, the reducer, the ring, the unscale, AdamW and the schedule.

Also the learning control: torch's single-process run (torch_impl/train.py's Run) on the
same global batches, whose losses the N-rank run's are held to (claim ddp.gpt_loss_curve).

The scaled precisions and bf16-sr (claim ddp.gpt_scaled) run the command's own job
(torch_impl/ddp_train.py's train_job with record=True: the command's loop, which records
what gpt_job records plus every step's amax vector and the final state), replayed the same
way: the reference's ranks draw their own bits by NOTE [ Random bits on N ranks ] and, for
fp8-delayed, reduce the torch ranks' amax vectors (NOTE [ Delayed scaling on N ranks ]).
`one_rank_grads` is the oracle of per-rank scaling: one process's backward on a rank's rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from common.ddp_bits import rank_bits
from common.fp8_train import WEIGHT_PRECISIONS, autocast_precision
from common.train_config import OPTIMIZERS, TrainConfig
from common.train_loop import batches
from parity.compare import as_numpy
from parity.drivers.ddp_train import OPTIONS
from parity.drivers.optim import FUSED, torch_sqrt
from reference import ddp_gpt as rgpt
from reference import loss_scaling as rls
from reference import optim as ropt
from reference.recipes_train import BF16SR
from reference.train import _make_scheduler
from reference.train_models import batch_of, build

STEPS = 3  # step 1: one bucket in parameter order; steps 2, 3: the rebuilt (ready-order) one
BATCH = 12  # rows of the global batch: 6, 4 or 3 a rank at 2, 3 or 4 ranks
# fp16: the scale doubles after every clean step (growth_interval 1) from 2^17, so that a
# step overflows within STEPS and every rank must skip it together (the test guards it)
FP16 = {"init_scale": 2.0**17, "growth_interval": 1}


# The command's GPT run of the kill and resume tests (parity/drivers/ddp_train.py's kills:
# saves at 2, 4, ..., 10): the MLP's fp16 options, whose skips (steps 4 and 6 at 2 torch ranks,
# 5 at 3, 6 and 7 in the reference) spare step 3, the first after the step-2 commit
GPT_OPTIONS = ("--model", "gpt", *OPTIONS)
# What `train --world-size N --model gpt` builds from GPT_OPTIONS and --steps 6 (the stopped
# and resumed run of the default test: parity/lab/runners/train_ranks.py's configuration)
RESUME = TrainConfig(model="gpt", precision="fp16", dropout=0.1, optimizer="AdamW",
                     schedule="cosine", horizon=6, batch_size=24, init_scale=2.0**17,
                     growth_interval=3)

def config(precision: str, steps: int = STEPS, seed: int = 0,
           recompute: str = "none") -> TrainConfig:
    """A GPT DDP run's configuration: AdamW, cosine over the run's steps, BATCH rows."""
    return TrainConfig(seed=seed, model="gpt", precision=precision, optimizer="AdamW",
                       schedule="cosine", horizon=steps, batch_size=BATCH, num_samples=48,
                       recompute=recompute, **(FP16 if precision == "fp16" else {}))


def gpt_jobs(world_size: int, precisions: tuple[str, ...], steps: int = STEPS,
             recompute: str = "none") -> list[dict]:
    from torch_impl import ddp_jobs

    return [ddp_jobs.gpt_job(config(p, steps, recompute=recompute), steps, world_size)
            for p in precisions]


def scaled_jobs(directory: Path, world_size: int, precisions: tuple[str, ...],
                steps: int = STEPS) -> list[dict]:
    """The command's job (record=True) of config(P, steps) for each precision P, without
    dropout, one checkpoint at the end, in directory/<P>."""
    from torch_impl.ddp_train import train_job

    for p in precisions:
        (directory / p).mkdir(parents=True, exist_ok=True)
    return [train_job(config(p, steps), steps, world_size, directory / p, 0, keep=1,
                      resume=None, log=directory / f"{p}.log", record=True)
            for p in precisions]


def resume_config(precision: str) -> TrainConfig:
    """RESUME (the command's run) at another precision, without dropout (so that
    one_rank_grads may replay a rank's first step)."""
    return replace(RESUME, precision=precision, dropout=0.0)


def resume_jobs(directory: Path, world_size: int, steps: int = 6, stop: int = 2,
                run: TrainConfig = RESUME, record: bool = False) -> list[dict]:
    """Three runs of the command's job (torch_impl/ddp_train.py's train_job) of RESUME, to be
    launched in a row, committing every `stop` steps: to `steps` uninterrupted
    (directory/uninterrupted), to `stop` (directory/stopped), then resumed from that commit to
    `steps`. Rank 0's step lines go to <name>.log beside them. The steps after the resumed
    run's first read what its first wrote: the schedule steps after an applied update, so a
    position restored wrongly shows in the update after (a skipped step would hide it)."""
    from torch_impl.ddp_train import train_job

    jobs = []
    for name, until, resume in (("uninterrupted", steps, None), ("stopped", stop, None),
                                ("stopped", steps, stop)):
        (directory / name).mkdir(parents=True, exist_ok=True)
        jobs.append(train_job(run, until, world_size, directory / name, stop, keep=2,
                              resume=resume, log=directory / f"{name}.log",
                              record=record and name == "uninterrupted"))
    return jobs

@dataclass
class Replay:
    """The reference's simulated ranks replaying a torch gpt_job: per step the reduced
    gradients, the buckets, the lr it stepped with and whether it skipped; at the end every
    rank's parameters and AdamW/schedule state (reference.ddp_gpt.optimizer_state), its
    model buffers (fp8-delayed's histories and scales) and its BitStream's state."""

    reduced: list[list[np.ndarray]] = field(default_factory=list)
    buckets: list[list[list[int]]] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)
    final: list[list[np.ndarray]] = field(default_factory=list)
    optimizer: list[dict[str, Any]] = field(default_factory=list)
    buffers: list[dict[str, np.ndarray]] = field(default_factory=list)
    bits: list[dict[str, Any] | None] = field(default_factory=list)


def replay(job: dict, results: list[list[dict]], index: int) -> Replay:
    """The reference's ranks on job `index` of a launch (results[rank][index]): the torch run's
    initial parameters, its batches, its local gradients; AdamW with torch's CPU sqrt and
    fused multiply-adds (NOTE [ torch's CPU sqrt is MKL's ], NOTE [ FMA in torch's CPU
    kernels ]) and the same schedule; a scaled precision's ranks with their own bits
    (common.ddp_bits.rank_bits), bf16-sr's BF16SR with torch's sqrt."""
    c = TrainConfig(**{k: tuple(v) if k == "sizes" else v for k, v in job["config"].items()})
    ws = job["world_size"]
    models, optimizers, schedulers, scalers, streams, parts0 = [], [], [], [], [], None
    for rank in range(ws):
        bits = rank_bits(c.seed, c.precision, rank)
        parts = build(c, np.random.default_rng(c.seed), bits)
        parts0 = parts0 or parts
        for p, t in zip(parts.model.parameters(), results[rank][index]["initial"], strict=True):
            np.copyto(p.data, as_numpy(t))
        if c.precision in WEIGHT_PRECISIONS:
            opt: Any = BF16SR(parts.model.parameters(), bits, lr=c.lr, **OPTIMIZERS["AdamW"],
                              sqrt=torch_sqrt)
        else:
            opt = ropt.AdamW(parts.model.parameters(), lr=c.lr, **OPTIMIZERS["AdamW"],
                             fma=FUSED, sqrt=torch_sqrt)
        models.append(parts.model)
        optimizers.append(opt)
        schedulers.append(_make_scheduler(opt, c))
        scalers.append(rls.make_scaler(autocast_precision(c.precision),
                                       init_scale=c.init_scale,
                                       growth_interval=c.growth_interval))
        streams.append(bits)
    out = Replay()
    data = batches(c, parts0.loader, batch_of)
    for k in range(job["steps"]):
        x, y = next(data)
        out.lrs.append(optimizers[0].param_groups[0]["lr"])

        def local(rank: int, k: int = k) -> list[np.ndarray]:
            return [as_numpy(g) for g in results[rank][index]["steps"][k]["local"]]

        def amax(rank: int, k: int = k) -> np.ndarray:
            return as_numpy(results[rank][index]["steps"][k]["amax"])

        record = rgpt.ddp_step(models, optimizers, scalers, x, y, step=min(k + 1, 2),
                               precision=c.precision, local_grads=local, local_amax=amax)
        for scheduler, result in zip(schedulers, record.results, strict=True):
            if not result.skipped:
                scheduler.step()
        out.reduced.append(record.reduced)
        out.buckets.append(record.buckets)
        out.skipped.append(record.results[0].skipped)
    for model, opt, scheduler in zip(models, optimizers, schedulers, strict=True):
        out.final.append([p.data.copy() for p in model.parameters()])
        out.optimizer.append(rgpt.optimizer_state(opt, scheduler, model.parameters()))
        out.buffers.append({n: b.copy() for n, b in model.named_buffers()})
    out.bits = [None if b is None else b.state() for b in streams]
    return out


def one_rank_grads(job: dict, results: list[list[dict]], index: int, rank: int
                   ) -> list[Any]:
    """The oracle of a rank's first local gradient: torch's single-process backward of the
    job's scaled GPT (the torch run's initial parameters, rank's own fresh bits) on rank's
    rows of the first global batch, without DDP (torch_impl/train.py's train_step up to its
    backward). Per-rank scaling means the rank's recorded local gradient is these bits."""
    import torch

    from torch_impl.ddp import shard
    from torch_impl.train_models import batch_of as torch_batch_of
    from torch_impl.train_models import build as torch_build

    c = TrainConfig(**{k: tuple(v) if k == "sizes" else v for k, v in job["config"].items()})
    ws = job["world_size"]
    parts = torch_build(c, torch.Generator().manual_seed(c.seed), torch.device("cpu"),
                        torch.Generator(), rank_bits(c.seed, c.precision, rank))
    params = list(parts.model.parameters())
    with torch.no_grad():
        for p, t in zip(params, results[rank][index]["initial"], strict=True):
            p.copy_(t)
    x, y = next(batches(c, parts.loader, torch_batch_of))
    xr, yr = (shard(t, rank, ws).contiguous() for t in (x, y))
    parts.loss_fn(parts.model(xr), yr).backward()
    return [p.grad for p in params]


def ddp_losses(results: list[list[dict]], index: int) -> list[float]:
    """The global batch's loss at every step of a torch gpt_job: the mean of the ranks'
    shard losses, in float64 (what `train --world-size N` prints)."""
    ws = len(results)
    steps = len(results[0][index]["steps"])
    return [sum(float(results[r][index]["steps"][k]["loss"]) for r in range(ws)) / ws
            for k in range(steps)]


def one_process_losses(c: TrainConfig, steps: int) -> list[float]:
    """The losses of torch's single-process run of `c` (the same weights and global batches:
    torch_impl/train.py's Run), step by step."""
    from torch_impl.train import Run

    run = Run(c)
    return [run.train_step().loss for _ in range(steps)]
