"""Loss scaling across data-parallel ranks on the real engine: DDP over gloo, a
torch.amp.GradScaler per rank. See reference/ddp_scaler.py for the mechanism (NOTE
[ found_inf is per rank ]: the divergence, the fault, the repair); this file states one
rank's step (ScalerRecord, scaler_step; the reference's steps every simulated rank at once),
and what torch does. Its last section is how a rank runs it (scaler_job, run: harness, a few
lines, called by ranks.launch).

What torch does:
- GradScaler keeps found_inf per optimizer per device, a float32 tensor filled by unscale_
  (`torch._amp_foreach_non_finite_check_and_unscale_`) and read by step (`.item()`) and
  update (`torch._amp_update_scale_`); `scaler._found_inf_per_device(optimizer)` returns
  those very tensors, so a dist.all_reduce on them in place between unscale_ and step is
  what step and update then see (repair "max" and "sum").
- torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler is a GradScaler whose
  unscale_ ends with that all-reduce (ReduceOp.SUM, async, then wait) on its process_group;
  nothing in it needs FSDP: with device="cpu" it runs under DDP on gloo (repair "sharded",
  mirrored by the reference's "sum"). On CPU its update is its own Python rule
  (`_amp_update_scale_cpu_`: found_inf >= 1 backs off; no finiteness check on growth),
  the same bits as torch's kernel for this run's power-of-two factors.
- The cross-rank check gathers each rank's rank_check.RankState with
  dist.all_gather_object after every update; check "raise" makes every rank raise
  RankDivergence at the first step that differs, which ends the launch with DDPError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from common import rank_check
from common.arg_ranges import (
    SCALER_CHECKS,
    SCALER_REPAIR_ERROR,
    SCALER_REPAIRS,
    WORLD_SIZES,
    check_choice,
    check_int,
)
from common.train_config import TrainConfig
from common.train_loop import batches
from torch_impl import amp, loss_scaling
from torch_impl.ddp import Replica, replica, shard
from torch_impl.train_models import batch_of

# the declared ranges (common/arg_ranges.py); "sharded": ShardedGradScaler (its SUM)
REPAIRS = SCALER_REPAIRS
CHECKS = SCALER_CHECKS


def _check_repair(repair: object) -> None:
    """The reference's check_repair: one of REPAIRS, else the same line."""
    if not isinstance(repair, str) or repair not in REPAIRS:
        raise ValueError(SCALER_REPAIR_ERROR.format(REPAIRS, repair))


def tamper_(grads: list[torch.Tensor]) -> None:
    """The seeded fault: the first element of the first parameter's gradient becomes +inf."""
    grads[0].reshape(-1)[0] = float("inf")


def sync_found_inf(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer,
                   op: str, group: Any) -> None:
    """The repair: this rank's found_inf all-reduced in place (ReduceOp MAX or SUM)."""
    reduce_op = {"max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM}[op]
    for found_inf in scaler._found_inf_per_device(optimizer).values():
        dist.all_reduce(found_inf, op=reduce_op, group=group)


def _make_scaler(c: TrainConfig, repair: str, group: Any) -> torch.amp.GradScaler:
    if repair == "sharded":
        return ShardedGradScaler("cpu", init_scale=c.init_scale,
                                 growth_interval=c.growth_interval, process_group=group)
    return loss_scaling.make_scaler(c.precision, "cpu", init_scale=c.init_scale,
                                    growth_interval=c.growth_interval)


@dataclass
class ScalerRecord:
    """One step on this rank: its local gradients (before DDP's reduction), the found_inf
    scaler.step used, the scale it used, whether it skipped, and every rank's state after
    update (rank_check.RankState) with the cross-rank check's verdict (None: they agree)."""

    local: list[torch.Tensor]
    found_inf: float
    scale: float
    skipped: bool
    states: list[rank_check.RankState]
    divergence: str | None


def scaler_step(rep: Replica, scaler: torch.amp.GradScaler, x: torch.Tensor, y: torch.Tensor,
                *, rank: int, world_size: int, step: int, fault: tuple[int, int] | None,
                repair: str, group: Any) -> ScalerRecord:
    """One DDP step on rank `rank` with its own GradScaler (reference.ddp_scaler.scaler_step's
    order): the backward (DDP reduces inside it); `fault` (rank, step) tampers this rank's
    reduced gradient at that step; unscale_; `repair` "max" or "sum" all-reduces found_inf
    ("sharded": ShardedGradScaler's unscale_ did; "none": it stays per rank); step and
    update; then every rank's state gathered and checked (rank_check)."""
    _check_repair(repair)  # an unknown one was taken as "none"
    c, optimizer, params = rep.config, rep.optimizer, rep.params
    optimizer.zero_grad(set_to_none=True)
    xr, yr = shard(x, rank, world_size), shard(y, rank, world_size)
    with amp.autocast(amp.autocast_dtype(c.precision), "cpu"):
        loss = rep.parts.loss_fn(rep.ddp(xr), yr)
    scaler.scale(loss).backward()  # DDP: every rank's .grad is the same reduced g
    if fault is not None and fault == (rank, step):
        tamper_([p.grad for p in params])
    scaler.unscale_(optimizer)  # "sharded": all-reduces found_inf (SUM) itself
    if repair in ("max", "sum"):
        sync_found_inf(scaler, optimizer, repair, group)
    scale = scaler.get_scale()
    found_inf = sum(v.item() for v in scaler._found_inf_per_device(optimizer).values())
    scaler.step(optimizer)
    skipped = loss_scaling.step_skipped(scaler, optimizer)
    scaler.update()
    mine = rank_check.RankState(found_inf, scaler.get_scale(), rank_check.digest(
        scaler.get_scale(), [p.detach().numpy() for p in params]))
    states: list[Any] = [None] * world_size
    dist.all_gather_object(states, mine, group=group)
    return ScalerRecord([rep.local[i] for i in range(len(params))], found_inf, scale, skipped,
                        states, rank_check.divergence(step, states))


# -- How a rank runs this: the drivers' job and the launcher's entry point (harness) --------


def scaler_job(config: TrainConfig, steps: int, world_size: int,
               fault: tuple[int, int] | None, repair: str, check: str = "record"
               ) -> dict[str, Any]:
    """`steps` DDP steps of `config`'s MLP in fp16 with a GradScaler per rank; `fault`
    (rank, step): that rank's reduced gradient made +inf at that step (tamper_); `repair`
    one of REPAIRS; `check` "record" (the cross-rank verdict per step) or "raise"."""
    _check_repair(repair)
    check_choice("scaler_job", "check", check, CHECKS)
    world_size = check_int("scaler_job", "world_size", world_size, WORLD_SIZES)
    if config.model != "mlp" or config.optimizer != "SGD" or config.dropout != 0.0:
        raise ValueError("scaler_job: an MLP, optimizer 'SGD', dropout 0")
    if config.precision != "fp16":
        raise ValueError(f"scaler_job: precision must be 'fp16' (the GradScaler's), got "
                         f"{config.precision!r}")
    if config.batch_size % world_size:
        raise ValueError(f"scaler_job: batch_size {config.batch_size} does not split into "
                         f"{world_size} equal shards")
    rank_check.check_fault(fault, world_size)
    return {"kind": "scaler", "runner": __name__, "config": config.to_dict(), "steps": steps,
            "world_size": world_size, "fault": fault, "repair": repair, "check": check}


def run(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """The scaler job on this rank: scaler_step, step after step; records per step the local
    gradients, the found_inf step used, the scale step used, whether it skipped, and every
    rank's RankState with the check's verdict (check "raise": RankDivergence at the first)."""
    ws, repair = job["world_size"], job["repair"]
    fault = None if job["fault"] is None else tuple(job["fault"])
    rep = replica(job, group)
    scaler = _make_scaler(rep.config, repair, group)
    steps: list[dict[str, Any]] = []
    data = batches(rep.config, rep.parts.loader, batch_of)
    for step in range(1, job["steps"] + 1):
        x, y = next(data)
        rec = scaler_step(rep, scaler, x, y, rank=rank, world_size=ws, step=step, fault=fault,
                          repair=repair, group=group)
        if job["check"] == "raise" and rec.divergence is not None:
            raise rank_check.RankDivergence(rec.divergence)
        steps.append({"local": rec.local, "found_inf": rec.found_inf, "scale": rec.scale,
                      "skipped": rec.skipped, "states": [vars(s) for s in rec.states],
                      "divergence": rec.divergence})
    return {"initial": rep.initial, "steps": steps,
            "final": [p.detach().clone() for p in rep.params]}
