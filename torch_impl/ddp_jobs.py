"""How a rank runs the ddp topic's jobs: the job constructors the drivers call and the
`run(job, rank, group)` the launcher (ranks/) calls on every rank. Harness, not mechanism:
the DDP step itself is torch_impl/ddp.py's `ddp_step`, the ring is dist.all_reduce; this
file seeds their inputs and records what parity/drivers/ddp.py compares. It is kept out of
torch_impl/ddp.py so that the twin reads against reference/ddp.py name for name.

Jobs: `allreduce_job` (dist.all_reduce of seeded tensors: the ring's oracle), `train_job`
(DDP training steps: ddp_step, step after step, on the loader's global batches), `gpt_job`
(the same for the GPT with AdamW and its schedule: torch_impl/ddp_gpt.py's ddp_step).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from common.train_config import TrainConfig
from common.train_loop import batches
from torch_impl import ddp_gpt, loss_scaling
from torch_impl.ddp import ddp_step, replica
from torch_impl.format_spec import DTYPES
from torch_impl.train_models import batch_of

RANK_DTYPES = ("float16", "bfloat16", "float32", "float64")  # what a job's ranks reduce


def allreduce_job(dtype: str, n: int, seed: int, world_size: int) -> dict[str, Any]:
    """dist.all_reduce (sum) of n elements of `dtype`; rank r's values are seeded by (seed, r):
    N(0, 1) times a power of two in [2^-8, 2^8], finite in every dtype."""
    if dtype not in RANK_DTYPES or n < 1:
        raise ValueError(f"allreduce_job: dtype one of {RANK_DTYPES}, n >= 1; got {dtype!r}, {n}")
    return {"kind": "allreduce", "runner": __name__, "dtype": dtype, "n": n, "seed": seed,
            "world_size": world_size}


def train_job(config: TrainConfig, steps: int, world_size: int,
              gradient_as_bucket_view: bool = False) -> dict[str, Any]:
    """`steps` DDP steps of `config`'s MLP; the loader's global batch is split by rank
    (ddp.shard's stride); SGD as config.optimizer must say, constant lr, no dropout.
    `gradient_as_bucket_view`: DDP's option, with zero_grad(set_to_none=False) (else the
    gradients never alias their bucket views)."""
    if config.model != "mlp" or config.optimizer != "SGD" or config.dropout != 0.0:
        raise ValueError("train_job: an MLP, optimizer 'SGD', dropout 0 (each rank would need "
                         "its own dropout stream)")
    if config.batch_size % world_size:
        raise ValueError(f"train_job: batch_size {config.batch_size} does not split into "
                         f"{world_size} equal shards")
    return {"kind": "train", "runner": __name__, "config": config.to_dict(), "steps": steps,
            "world_size": world_size, "gradient_as_bucket_view": gradient_as_bucket_view}


def gpt_job(config: TrainConfig, steps: int, world_size: int) -> dict[str, Any]:
    """`steps` DDP steps of `config`'s GPT (AdamW, the config's schedule, stepped after every
    step that is not skipped), the global batch split by rank; no dropout (each rank would
    draw from its own stream: the command's run has them, torch_impl/ddp_train.py)."""
    if config.model != "gpt" or config.optimizer != "AdamW" or config.dropout != 0.0:
        raise ValueError("gpt_job: the GPT, optimizer 'AdamW', dropout 0")
    if config.batch_size % world_size:
        raise ValueError(f"gpt_job: batch_size {config.batch_size} does not split into "
                         f"{world_size} equal shards")
    return {"kind": "gpt", "runner": __name__, "config": config.to_dict(), "steps": steps,
            "world_size": world_size}


def seeded(seed: int, rank: int, n: int, dtype: str) -> torch.Tensor:
    """Rank r's n values of a collective's probe: N(0, 1) times 2^k, k uniform in [-8, 8],
    drawn in float64 from the generator seeded (seed, r), then cast to `dtype`."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank)
    values = torch.randn(n, generator=g, dtype=torch.float64)
    values = values * torch.exp2(torch.randint(-8, 9, (n,), generator=g).double())
    return values.to(DTYPES[dtype])


def run(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """This rank's side of an allreduce_job (its input and dist.all_reduce's output) or a
    train_job (the initial parameters, every step's StepRecord as a dict, the final ones)."""
    if job["kind"] == "allreduce":
        t = seeded(job["seed"], rank, job["n"], job["dtype"])
        before = t.clone()
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t, group=group)
        return {"input": before, "output": t.cpu()}
    if job["kind"] == "gpt":
        return _gpt(job, rank, group)
    ws, as_view = job["world_size"], job["gradient_as_bucket_view"]
    rep = replica(job, group, as_view)
    c = rep.config
    scaler = loss_scaling.make_scaler(c.precision, "cpu", init_scale=c.init_scale,
                                      growth_interval=c.growth_interval)
    steps: list[dict[str, Any]] = []
    data = batches(c, rep.parts.loader, batch_of)
    while len(steps) < job["steps"]:
        x, y = next(data)
        record = ddp_step(rep, scaler, x, y, rank=rank, world_size=ws,
                          gradient_as_bucket_view=as_view)
        (xr, yr) = record.rows
        steps.append({"local": record.local, "reduced": record.reduced,
                      "buckets": record.buckets, "loss": record.loss, "x": xr.clone(),
                      "y": yr.clone(), "output": record.output})
    return {"initial": rep.initial, "steps": steps,
            "final": [p.detach().clone() for p in rep.params]}


def _gpt(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """A gpt_job on this rank: the initial parameters, every step's record (local and
    reduced gradients, buckets, loss, scale, skipped, lr), the final parameters and AdamW's
    state (the table's entries: reference.ddp_gpt.optimizer_state's keys)."""
    ws = job["world_size"]
    c = TrainConfig(**{k: tuple(v) if k == "sizes" else v for k, v in job["config"].items()})
    rep = ddp_gpt.replica(c, group)
    scaler = loss_scaling.make_scaler(c.precision, "cpu", init_scale=c.init_scale,
                                      growth_interval=c.growth_interval)
    steps: list[dict[str, Any]] = []
    data = batches(c, rep.parts.loader, batch_of)
    while len(steps) < job["steps"]:
        x, y = next(data)
        lr = rep.optimizer.param_groups[0]["lr"]
        record = ddp_gpt.ddp_step(rep, scaler, x, y, rank=rank, world_size=ws)
        if not record.skipped:
            rep.scheduler.step()
        steps.append({"local": record.local, "reduced": record.reduced,
                      "buckets": record.buckets, "loss": record.loss, "scale": record.scale,
                      "skipped": record.skipped, "lr": lr})
    state = ddp_gpt.optimizer_state(rep.optimizer, rep.scheduler, rep.params)
    return {"initial": rep.initial, "steps": steps,
            "final": [p.detach().clone() for p in rep.params],
            "optimizer": {k: v.detach().clone() for k, v in state.items()}}
