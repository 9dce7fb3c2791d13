"""The compact transformer under DistributedDataParallel, with AdamW: one rank's DDP step of
the GPT, and the rank's AdamW and schedule entries of a sharded checkpoint. See
reference/ddp_gpt.py for the step over simulated ranks and NOTE [ The GPT's ready order ];
this file states one rank's step on the real engine (torch_impl/ddp.py's, for the GPT).

What the engine does that the reference states: DDP's reducer lays out its bucket in the
order the gradients become ready (reference.ddp_gpt.ready_order mirrors it), pre-divides
and ring-reduces inside `loss.backward()`; torch.optim.AdamW is the reference's AdamW (its
state: step, a float32 0-d tensor, exp_avg, exp_avg_sq, created at the first step), the
schedule is torch.optim.lr_scheduler's (torch_impl/train.py's choice of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from common.train_config import OPTIMIZERS, TrainConfig
from torch_impl import amp, loss_scaling
from torch_impl.ddp import StepRecord, shard
from torch_impl.train import _make_scheduler
from torch_impl.train_models import build


@dataclass
class Replica:
    """One rank's side of a DDP run of the GPT: its config, model parts, parameters (and
    their initial values), the DDP wrapper, AdamW, the schedule, and `local`: the rank's
    local gradient of each parameter at the last backward (a tensor hook sees it before
    AccumulateGrad and DDP's reducer)."""

    config: TrainConfig
    parts: Any
    params: list[torch.nn.Parameter]
    initial: list[torch.Tensor]
    ddp: DistributedDataParallel
    optimizer: torch.optim.AdamW
    scheduler: torch.optim.lr_scheduler.LRScheduler
    local: dict[int, torch.Tensor]


def replica(config: TrainConfig, group: Any) -> Replica:
    """The GPT of `config` (its seed: the same weights on every rank) under DDP on `group`,
    AdamW and the run's schedule, and the local-gradient hooks."""
    c = config
    if c.model != "gpt" or c.optimizer != "AdamW":
        raise ValueError(f"ddp_gpt.replica: model 'gpt' with optimizer 'AdamW', got "
                         f"{c.model!r}, {c.optimizer!r}")
    parts = build(c, torch.Generator().manual_seed(c.seed), torch.device("cpu"),
                  torch.Generator())
    params = list(parts.model.parameters())
    initial = [p.detach().clone() for p in params]
    ddp = DistributedDataParallel(parts.model, process_group=group)  # bucket_cap_mb=25
    optimizer = torch.optim.AdamW(params, lr=c.lr, **OPTIMIZERS["AdamW"])
    scheduler = _make_scheduler(optimizer, c)
    local: dict[int, torch.Tensor] = {}
    for i, p in enumerate(params):
        p.register_hook(lambda g, i=i: local.__setitem__(i, g.detach().clone()))
    return Replica(c, parts, params, initial, ddp, optimizer, scheduler, local)


def ddp_step(rep: Replica, scaler: torch.amp.GradScaler, x: torch.Tensor, y: torch.Tensor,
             *, rank: int, world_size: int) -> StepRecord:
    """One DDP step of the GPT on rank `rank`, which trains on shard(x, rank, ws):
    torch_impl.train's step up to its backward (zero_grad, autocast forward, the float32
    next-token loss, scale(loss).backward(), inside which DDP's reducer writes the reduced
    gradient into .grad), then the optimizer phase (unscale_, AdamW step unless inf/NaN,
    update). The run steps the schedule after it, unless it skipped."""
    c, loss_fn = rep.config, rep.parts.loss_fn
    rep.optimizer.zero_grad(set_to_none=True)
    # (B/ws, T) token ids; contiguous, as NextTokenLoss's view(-1) of the targets needs
    xr, yr = (shard(t, rank, world_size).contiguous() for t in (x, y))
    with amp.autocast(amp.autocast_dtype(c.precision), "cpu"):
        output = rep.ddp(xr)  # (logits, None)
        loss = loss_fn(output, yr)
    scaler.scale(loss).backward()  # the reducer runs here
    index = {id(p): i for i, p in enumerate(rep.params)}
    buckets = [[index[id(p)] for p in b.parameters()]
               for b in rep.ddp.reducer._get_zeros_like_grad_buckets()]
    record = StepRecord((xr, yr), [rep.local[i] for i in range(len(rep.params))],
                        [p.grad.detach().clone() for p in rep.params], buckets,
                        loss.detach().clone(), output[0].detach().clone(), scaler.get_scale())
    scaler.unscale_(rep.optimizer)
    scaler.step(rep.optimizer)
    record.skipped = loss_scaling.step_skipped(scaler, rep.optimizer)
    scaler.update()
    return record


def optimizer_state(optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler,
                    params: Sequence[torch.nn.Parameter]) -> dict[str, torch.Tensor]:
    """AdamW's and the schedule's entries of a rank's sharded state (the table in
    torch_impl/sharded_ckpt.py; reference.ddp_gpt.optimizer_state). Before the first step
    the state is created as AdamW creates it (zeros, step 0), so that the entries alias the
    live tensors and a template for load_sharded fills them in place."""
    state: dict[str, torch.Tensor] = {}
    for i, p in enumerate(params):
        s = optimizer.state[p]
        if not s:  # AdamW's lazy initialization, ahead of its first step
            s["step"] = torch.tensor(0.0, dtype=torch.float32)
            s["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            s["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state[f"optim/step/{i}"] = s["step"]
        state[f"optim/exp_avg/{i}"] = s["exp_avg"]
        state[f"optim/exp_avg_sq/{i}"] = s["exp_avg_sq"]
    state["optim/lr"] = torch.tensor(optimizer.param_groups[0]["lr"], dtype=torch.float64)
    state["sched/last_epoch"] = torch.tensor(scheduler.last_epoch, dtype=torch.int64)
    state["sched/step_count"] = torch.tensor(scheduler._step_count, dtype=torch.int64)
    return state


def load_optimizer_state(state: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer,
                         scheduler: torch.optim.lr_scheduler.LRScheduler,
                         params: Sequence[torch.nn.Parameter]) -> None:
    """Set AdamW and the schedule from optimizer_state's entries (the buffers are filled in
    place by load_sharded already where the template aliased them; copied here too, so that
    a state from elsewhere loads the same)."""
    for i, p in enumerate(params):
        s = optimizer.state[p]
        for name in ("step", "exp_avg", "exp_avg_sq"):
            value = state[f"optim/{name}/{i}"]
            if s.get(name) is not value:
                s[name] = value.detach().clone()
    lr = float(state["optim/lr"])
    for group in optimizer.param_groups:
        group["lr"] = lr
    sd = scheduler.state_dict()
    sd.update(last_epoch=int(state["sched/last_epoch"]),
              _step_count=int(state["sched/step_count"]), _last_lr=[lr])
    scheduler.load_state_dict(sd)
