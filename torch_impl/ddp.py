"""Data parallel on the real engine: DistributedDataParallel of the torch tree's MLP, one
process per rank, torch.distributed over gloo. See reference/ddp.py for the arithmetic
(NOTE [ gloo's ring segments ], NOTE [ DDP's reducer ]); this file states one rank's step.

What the engine does that the reference states: the ring's order is inside gloo's C++
(gloo/allreduce.cc: reference.ddp.ring_allreduce is dist.all_reduce), the buckets and the
pre-division inside DDP's C++ Reducer (reference.ddp.step_buckets, reduce_gradients and
reduce_into are what `loss.backward()` under DDP does). The reference cannot see them; it
mirrors them, and parity/test_ddp.py compares the bits.

Where the reference simulates every rank in one call (ddp_step over a list of replicas),
a torch rank is a process: `ddp_step` here is one rank's step, and the ranks meet inside
backward. How a rank is started and what it records for the tests is harness, not the
mechanism: torch_impl/ddp_jobs.py (the jobs) and ranks/ (the launcher).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from common.arg_ranges import WORLD_SIZES, check_int
from common.train_config import TrainConfig
from torch_impl import amp, loss_scaling
from torch_impl.train_models import build


def shard(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s rows of a global batch: x[rank::ws] (reference.ddp.shard)."""
    world_size = check_int("shard", "world_size", world_size, WORLD_SIZES)
    rank = check_int("shard", "rank", rank, range(world_size))
    if len(x) % world_size:
        raise ValueError(f"shard: a batch of {len(x)} rows does not split into {world_size} "
                         "equal shards")
    return x[rank::world_size]


@dataclass
class StepRecord:
    """One DDP step on this rank: its rows (x, y), its local gradient (scaled, before the
    reduction), the reduced gradient DDP wrote into .grad (the same on every rank), the
    buckets DDP reduced it in (parameter indices), the rank's loss and output, and, as the
    reference's `results` hold per rank, the scale the step used and whether it skipped."""

    rows: tuple[torch.Tensor, torch.Tensor]
    local: list[torch.Tensor]
    reduced: list[torch.Tensor]
    buckets: list[list[int]]
    loss: torch.Tensor
    output: torch.Tensor
    scale: float = 1.0
    skipped: bool = False


@dataclass
class Replica:
    """One rank's side of a DDP run: its config, model parts, parameters (and their initial
    values), the DDP wrapper, SGD, and `local`: the rank's local gradient of each parameter
    at the last backward (a tensor hook sees it before AccumulateGrad and DDP's reducer)."""

    config: TrainConfig
    parts: Any
    params: list[torch.nn.Parameter]
    initial: list[torch.Tensor]
    ddp: DistributedDataParallel
    optimizer: torch.optim.SGD
    local: dict[int, torch.Tensor]


def replica(job: dict[str, Any], group: Any, gradient_as_bucket_view: bool = False) -> Replica:
    """The model of job["config"] (its seed: the same on every rank) under DDP on `group`,
    SGD with momentum 0.9, and the local-gradient hooks."""
    c = TrainConfig(**{k: tuple(v) if k == "sizes" else v for k, v in job["config"].items()})
    parts = build(c, torch.Generator().manual_seed(c.seed), torch.device("cpu"),
                  torch.Generator())
    params = list(parts.model.parameters())
    initial = [p.detach().clone() for p in params]
    ddp = DistributedDataParallel(parts.model, process_group=group,  # bucket_cap_mb=25
                                  gradient_as_bucket_view=gradient_as_bucket_view)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=c.lr, momentum=0.9)
    local: dict[int, torch.Tensor] = {}
    for i, p in enumerate(params):
        p.register_hook(lambda g, i=i: local.__setitem__(i, g.detach().clone()))
    return Replica(c, parts, params, initial, ddp, optimizer, local)


def ddp_step(rep: Replica, scaler: torch.amp.GradScaler, x: torch.Tensor, y: torch.Tensor,
             *, rank: int, world_size: int, gradient_as_bucket_view: bool = False
             ) -> StepRecord:
    """One DDP step on rank `rank`, which trains on shard(x, rank, ws).

    As torch_impl.train's step up to its backward (zero_grad, autocast forward, float32 loss,
    scale(loss).backward()); inside that backward DDP's reducer pre-divides each gradient,
    all-reduces its buckets and writes the reduced gradient into .grad (reference.ddp's
    reduce_into); then the optimizer phase (unscale_, step unless inf/NaN, update).
    `gradient_as_bucket_view`: the replica's DDP option, with zero_grad(set_to_none=False)
    (NOTE [ DDP's reducer ] 4).
    """
    c, loss_fn = rep.config, rep.parts.loss_fn
    rep.optimizer.zero_grad(set_to_none=not gradient_as_bucket_view)
    xr, yr = shard(x, rank, world_size), shard(y, rank, world_size)
    with amp.autocast(amp.autocast_dtype(c.precision), "cpu"):
        output = rep.ddp(xr)
        loss = loss_fn(output, yr)
    scaler.scale(loss).backward()  # the reducer runs here, bucket by bucket
    index = {id(p): i for i, p in enumerate(rep.params)}
    buckets = [[index[id(p)] for p in b.parameters()]
               for b in rep.ddp.reducer._get_zeros_like_grad_buckets()]
    record = StepRecord((xr, yr), [rep.local[i] for i in range(len(rep.params))],
                        [p.grad.detach().clone() for p in rep.params], buckets,
                        loss.detach().clone(), output.detach().clone(), scaler.get_scale())
    scaler.unscale_(rep.optimizer)
    scaler.step(rep.optimizer)
    record.skipped = loss_scaling.step_skipped(scaler, rep.optimizer)
    scaler.update()
    return record


def __getattr__(name: str) -> Any:
    """The launcher's old path: `from torch_impl.ddp import launch, DDPError` still works,
    with a DeprecationWarning naming its place now (ranks/)."""
    if name in ("launch", "DDPError"):
        import warnings

        import ranks

        warnings.warn(f"torch_impl.ddp.{name} is ranks.{name} now", DeprecationWarning,
                      stacklevel=2)
        return getattr(ranks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
