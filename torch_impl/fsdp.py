"""FSDP2 on the real engine: `torch.distributed.fsdp.fully_shard` with a MixedPrecisionPolicy,
N gloo processes on this machine (ranks.launch). See reference/fsdp.py for the
arithmetic (NOTE [ FSDP2's shards ], NOTE [ FSDP2's reduce-scatter on gloo ]); this file
only runs it and records what each rank saw.

What the engine does that the reference states:
- fully_shard replaces each parameter by a DTensor Shard(0): rank r keeps torch.chunk's r-th
  row block, zero-padded to the first block's rows (FSDPParam._init_sharded_param).
- Before a module's forward, each rank casts its padded shard to param_dtype and
  all-gathers (dist.all_gather_single, a copy on gloo); after backward, the unsharded
  gradients (param_dtype) are chunk-catted into one reduce_dtype buffer and
  dist.reduce_scatter_single'd (foreach_reduce); on gloo that is a ring all-reduce of the
  whole buffer and a slice, ReduceOp.AVG a division by ws after the sum.
- The optimizer (torch.optim.AdamW, for-loop path) steps on the sharded DTensors: every op
  runs on the rank's local shard.

Names shared with the reference: OPS, gloo_reduce_scatter (the collective alone, one
rank's side), StepRecord and fsdp_step (one rank's step; the reference's steps every
simulated rank at once). The rest of the reference (shard, all_gather, reduce_scatter) is
inside fully_shard and has no Python of ours.

How a rank runs this (the last section, harness rather than mechanism): `fsdp_job`
(training steps of the MLP, every Linear fully_shard'ed, then the root) and
`reduce_scatter_job` (gloo_reduce_scatter of seeded tensors), and `run(job, rank, group)`,
which the launcher (ranks/) calls. They stay here, a few lines beside the step they drive,
because every one of them is FSDP2's: a job module of their own would hold nothing else.
Runs on CPU with gloo in torch 2.13: both reduce_dtype float32 and bfloat16 (gloo gained
ReduceOp.AVG and reduce_scatter; nothing falls back).

Versions: the collective is `dist.reduce_scatter_single` from torch 2.13, which deprecates
its old name `dist.reduce_scatter_tensor` (a FutureWarning); torch 2.6-2.12 have only the
old name (measured on 2.6.0, 2.11.0, 2.12.0, 2.13.0). `_reduce_scatter_single` is whichever
the installed torch has: the same collective under either name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from common.train_config import TrainConfig
from common.train_loop import batches
from torch_impl.ddp import shard
from torch_impl.ddp_jobs import RANK_DTYPES, seeded
from torch_impl.format_spec import DTYPES
from torch_impl.train_models import batch_of, build

REDUCE_DTYPES = ("float32", "bfloat16")
# The rule reference/fsdp.py states is torch >= 2.8's: _get_gradient_divide_factors returns the
# collectives' ReduceOps beside the pre/post factors (AVG for float32 and bfloat16), on 2.8.0,
# 2.11.0 and 2.13.0; 2.6.0 and 2.7.1 return the factors alone and divide by hand, and 2.6.0's
# fully_shard cannot run on CPU at all (torch.cpu.Stream has no record_event). Measured.
RULE_STATED = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 8)
NOT_STATED = (f"torch {torch.__version__}'s FSDP2 divides gradients by its pre/post factors, "
              "not the torch >= 2.8 rule reference/fsdp.py mirrors (torch_impl/fsdp.py)")
# torch >= 2.13's name, else the older one (module docstring: Versions)
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a plain tensor as it is), cloned."""
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}


def gloo_reduce_scatter(t: torch.Tensor, op: str = "sum", group: Any = None) -> torch.Tensor:
    """This rank's output of dist.reduce_scatter_single (OPS[op]) of its flat buffer `t` of
    ws * n elements: n elements, what reference.fsdp.gloo_reduce_scatter gives rank r."""
    out = torch.empty(t.numel() // dist.get_world_size(group), dtype=t.dtype)
    _reduce_scatter_single(out, t.clone(), op=OPS[op], group=group)
    return out


@dataclass
class StepRecord:
    """One FSDP2 step on this rank: its sharded gradients [param] (this rank's rows,
    unpadded, float32) and its loss."""

    grads: list[torch.Tensor]
    loss: torch.Tensor


def fsdp_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Any,
              x: torch.Tensor, y: torch.Tensor, *, rank: int, world_size: int) -> StepRecord:
    """One FSDP2 step on rank `rank` of a fully_shard'ed model, on rows rank::ws of the
    global batch (torch_impl.ddp.shard, DDP's). FSDP2 does reference.fsdp.fsdp_step's three parts
    inside: the all-gather before each module's forward, the reduce-scatter after its
    backward, and the optimizer steps on the sharded DTensors (every op on this rank's rows).
    """
    xr, yr = shard(x, rank, world_size), shard(y, rank, world_size)
    output = model(xr)  # the root casts xr to param_dtype (cast_forward_inputs)
    loss = loss_fn(output.float(), yr)
    loss.backward()  # 1. and 2. happen here, module by module
    grads = [_local(p.grad) for p in model.parameters()]
    optimizer.step()  # 3.
    optimizer.zero_grad(set_to_none=True)
    return StepRecord(grads, loss.detach().clone())


# -- How a rank runs this: the drivers' jobs and the launcher's entry point (harness) -------


def fsdp_job(config: TrainConfig, steps: int, world_size: int, reduce_dtype: str
             ) -> dict[str, Any]:
    """`steps` FSDP2 steps of `config`'s MLP with param_dtype bfloat16 and `reduce_dtype`;
    rank r trains on rows r::ws of the loader's global batch (reference.ddp.shard); AdamW
    as config.optimizer must say, constant lr, no dropout."""
    if config.model != "mlp" or config.optimizer != "AdamW" or config.dropout != 0.0:
        raise ValueError("fsdp_job: an MLP, optimizer 'AdamW', dropout 0 (each rank would "
                         "need its own dropout stream)")
    if config.precision != "fp32":
        raise ValueError(f"fsdp_job: precision must be 'fp32' (the MixedPrecisionPolicy "
                         f"casts, not autocast), got {config.precision!r}")
    if reduce_dtype not in REDUCE_DTYPES:
        raise ValueError(f"fsdp_job: reduce_dtype one of {REDUCE_DTYPES}, got {reduce_dtype!r}")
    if steps < 1 or world_size < 1:
        raise ValueError(f"fsdp_job: steps and world_size must be >= 1, got {steps}, "
                         f"{world_size}")
    if config.batch_size % world_size:
        raise ValueError(f"fsdp_job: batch_size {config.batch_size} does not split into "
                         f"{world_size} equal shards")
    return {"kind": "fsdp", "runner": __name__, "config": config.to_dict(), "steps": steps,
            "world_size": world_size, "reduce_dtype": reduce_dtype}


def reduce_scatter_job(dtype: str, n: int, op: str, seed: int, world_size: int
                       ) -> dict[str, Any]:
    """dist.reduce_scatter_single (op "sum" or "avg") of ws * n elements of `dtype` into n;
    rank r's values seeded by (seed, r) as torch_impl.ddp_jobs.allreduce_job's."""
    if dtype not in RANK_DTYPES or n < 1 or op not in ("sum", "avg"):
        raise ValueError(f"reduce_scatter_job: dtype one of {RANK_DTYPES}, n >= 1, op 'sum' "
                         f"or 'avg'; got {dtype!r}, {n}, {op!r}")
    return {"kind": "reduce_scatter", "runner": __name__, "dtype": dtype, "n": n, "op": op,
            "seed": seed, "world_size": world_size}


def run(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """The FSDP2 job on this rank: per step the unsharded parameters each Linear's forward
    used (param_dtype), the local unsharded gradients (a tensor hook, before FSDP's
    reduce-scatter), the sharded gradients, the sharded parameters after AdamW; at the end
    AdamW's sharded state. A reduce_scatter_job runs the collective alone."""
    if job["kind"] == "reduce_scatter":
        t = seeded(job["seed"], rank, job["world_size"] * job["n"], job["dtype"])
        return {"input": t, "output": gloo_reduce_scatter(t, job["op"], group)}
    ws = job["world_size"]
    c = TrainConfig(**{k: tuple(v) if k == "sizes" else v for k, v in job["config"].items()})
    parts = build(c, torch.Generator().manual_seed(c.seed), torch.device("cpu"),
                  torch.Generator())
    model, loss_fn = parts.model, parts.loss_fn
    initial = [p.detach().clone() for p in model.parameters()]  # full, the same on every rank
    mesh = DeviceMesh.from_group(group if group is not None else dist.group.WORLD, "cpu")
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                  reduce_dtype=DTYPES[job["reduce_dtype"]])
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    for layer in linears:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    sharded = [_local(p) for p in model.parameters()]  # this rank's rows, unpadded
    gathered: dict[int, torch.Tensor] = {}
    local: dict[int, torch.Tensor] = {}
    handles: list[Any] = []

    def record(layer_index: int) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:  # after FSDP's all-gather
            for j, p in enumerate((module.weight, module.bias)):
                i = 2 * layer_index + j
                gathered[i] = p.detach().clone()
                handles.append(p.register_hook(
                    lambda g, i=i: local.__setitem__(i, g.detach().clone())))
        return hook

    for k, layer in enumerate(linears):
        layer.register_forward_pre_hook(record(k))
    optimizer = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=0.01)
    params = list(model.parameters())
    steps: list[dict[str, Any]] = []
    data = batches(c, parts.loader, batch_of)
    while len(steps) < job["steps"]:
        x, y = next(data)
        rec = fsdp_step(model, optimizer, loss_fn, x, y, rank=rank, world_size=ws)
        for h in handles:
            h.remove()
        handles.clear()
        steps.append({"gathered": [gathered[i] for i in range(len(params))],
                      "local": [local[i] for i in range(len(params))], "grads": rec.grads,
                      "params": [_local(p) for p in params], "loss": rec.loss})
    state = [{name: _local(v) for name, v in optimizer.state[p].items()} for p in params]
    return {"initial": initial, "sharded": sharded, "steps": steps, "state": state}
