"""The compact transformer under DistributedDataParallel, with AdamW: one rank's DDP step of
the GPT, and the rank's AdamW and schedule entries of a sharded checkpoint. See
reference/ddp_gpt.py for the step over simulated ranks and NOTE [ The GPT's ready order ];
this file states one rank's step on the real engine (torch_impl/ddp.py's, for the GPT).

What the engine does that the reference states: DDP's reducer lays out its bucket in the
order the gradients become ready (reference.ddp_gpt.ready_order mirrors it), pre-divides
and ring-reduces inside `loss.backward()`; torch.optim.AdamW is the reference's AdamW (its
state: step, a float32 0-d tensor, exp_avg, exp_avg_sq, created at the first step), the
schedule is torch.optim.lr_scheduler's (torch_impl/train.py's choice of it).

A scaled precision: the replica's blocks are ScaledLinears (torch_impl/fp8_train.py), the
ranks' random bits the rule's (NOTE [ Random bits on N ranks ] in common/ddp_bits.py), bf16-sr
steps BF16SR (torch_impl/recipes_train.py) on the reduced float32 gradient; fp8-delayed's
amaxes are reduced with dist.all_reduce(MAX) on the DDP group after the backward, before the
scale update (NOTE [ Delayed scaling on N ranks ] in reference/ddp_gpt.py). DDP broadcasts
rank 0's buffers (the histories and scales) before every forward (broadcast_buffers): after
the reduction they are every rank's already, so that copies equal values. A BitStream's state
is a dict of ints, and DCP saves tensors only: bits_tensor packs it into 37 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from common.ddp_bits import bits_key, rank_bits
from common.fp8_train import DELAYED_TENSORS, WEIGHT_PRECISIONS, autocast_precision
from common.recipes_train import BitStream
from common.train_config import OPTIMIZERS, TrainConfig
from torch_impl import amp, loss_scaling
from torch_impl.ddp import StepRecord, shard
from torch_impl.fp8_train import ScaledLinear
from torch_impl.recipes_train import BF16SR
from torch_impl.train import _make_scheduler
from torch_impl.train_models import build


@dataclass
class Replica:
    """One rank's side of a DDP run of the GPT: its config, model parts, parameters (and
    their initial values), the DDP wrapper, AdamW (bf16-sr: BF16SR), the schedule, and
    `local`: the rank's local gradient of each parameter at the last backward (a tensor hook
    sees it before AccumulateGrad and DDP's reducer); `bits`: the rank's BitStream (nvfp4,
    bf16-sr); `delayed`: the fp8-delayed layers and `amax`, this rank's amax vector of the
    last step before the reduction (NOTE [ Delayed scaling on N ranks ])."""

    config: TrainConfig
    parts: Any
    params: list[torch.nn.Parameter]
    initial: list[torch.Tensor]
    ddp: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    local: dict[int, torch.Tensor]
    bits: BitStream | None = None
    delayed: list[ScaledLinear] = field(default_factory=list)
    amax: torch.Tensor | None = None


def replica(config: TrainConfig, group: Any) -> Replica:
    """The GPT of `config` (its seed: the same weights on every rank) under DDP on `group`,
    AdamW (bf16-sr: BF16SR, its weights rounded to bfloat16 before DDP sees them) and the
    run's schedule, the rank's bits (common.ddp_bits.rank_bits) and the local-gradient
    hooks; fp8-delayed layers with their update deferred."""
    c = config
    if c.model != "gpt" or c.optimizer != "AdamW":
        raise ValueError(f"ddp_gpt.replica: model 'gpt' with optimizer 'AdamW', got "
                         f"{c.model!r}, {c.optimizer!r}")
    bits = rank_bits(c.seed, c.precision, dist.get_rank(group))
    parts = build(c, torch.Generator().manual_seed(c.seed), torch.device("cpu"),
                  torch.Generator(), bits)
    params = list(parts.model.parameters())
    if c.precision in WEIGHT_PRECISIONS:  # bf16 weights, AdamWSR on the shared bits
        optimizer: torch.optim.Optimizer = BF16SR(params, bits, lr=c.lr, **OPTIMIZERS["AdamW"])
    else:
        optimizer = torch.optim.AdamW(params, lr=c.lr, **OPTIMIZERS["AdamW"])
    initial = [p.detach().clone() for p in params]
    ddp = DistributedDataParallel(parts.model, process_group=group)  # bucket_cap_mb=25
    scheduler = _make_scheduler(optimizer, c)
    local: dict[int, torch.Tensor] = {}
    for i, p in enumerate(params):
        p.register_hook(lambda g, i=i: local.__setitem__(i, g.detach().clone()))
    return Replica(c, parts, params, initial, ddp, optimizer, scheduler, local, bits,
                   defer_scale_updates(parts.model))


def defer_scale_updates(model: torch.nn.Module) -> list[ScaledLinear]:
    """NOTE [ Delayed scaling on N ranks ] 1: the fp8-delayed ScaledLinears in module order,
    their end-of-backward update deferred to update_scales."""
    layers = [m for m in model.modules() if isinstance(m, ScaledLinear) and m.recipe.delayed]
    for layer in layers:
        object.__setattr__(layer, "_update", _deferred)
    return layers


def _deferred() -> None:
    """A deferred layer's update at the end of its backward: nothing (update_scales runs it)."""


def amax_vector(layers: Sequence[ScaledLinear]) -> torch.Tensor:
    """This step's amaxes (slot 0 of every history), layer by layer, DELAYED_TENSORS in each."""
    return torch.stack([getattr(layer, f"fp8_amax_history_{t}")[0] for layer in layers
                        for t in DELAYED_TENSORS]).detach().clone()


def reduce_amax(amax: torch.Tensor, group: Any) -> torch.Tensor:
    """The ranks' amax vectors reduced with MAX (TE's reduce_tensor_across_group_op_max), in
    place; returned. A NaN of any rank is kept, as the canonical quiet NaN: gloo's MAX keeps
    or loses it by the element's place in the ring, so a second row of the same all-reduce
    says where any rank had one (NOTE [ Delayed scaling on N ranks ])."""
    both = torch.stack([amax, torch.isnan(amax).to(amax.dtype)])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    amax.copy_(torch.where(both[1] > 0, torch.full_like(amax, float("nan")), both[0]))
    return amax


@torch.no_grad()
def update_scales(layers: Sequence[ScaledLinear], amax: torch.Tensor) -> None:
    """Slot 0 of every history set to the reduced amax, then every layer's delayed update."""
    values = iter(amax)
    for layer in layers:
        for t in DELAYED_TENSORS:
            getattr(layer, f"fp8_amax_history_{t}")[0] = next(values)
        ScaledLinear._update(layer)


def ddp_step(rep: Replica, scaler: torch.amp.GradScaler, x: torch.Tensor, y: torch.Tensor,
             *, rank: int, world_size: int) -> StepRecord:
    """One DDP step of the GPT on rank `rank`, which trains on shard(x, rank, ws):
    torch_impl.train's step up to its backward (zero_grad, autocast forward, the float32
    next-token loss, scale(loss).backward(), inside which DDP's reducer writes the reduced
    gradient into .grad; fp8-delayed: the amaxes reduced, the scales updated), then the
    optimizer phase (unscale_, AdamW step unless inf/NaN,
    update). The run steps the schedule after it, unless it skipped."""
    c, loss_fn = rep.config, rep.parts.loss_fn
    rep.optimizer.zero_grad(set_to_none=True)
    # (B/ws, T) token ids; contiguous, as NextTokenLoss's view(-1) of the targets needs
    xr, yr = (shard(t, rank, world_size).contiguous() for t in (x, y))
    with amp.autocast(amp.autocast_dtype(autocast_precision(c.precision)), "cpu"):
        output = rep.ddp(xr)  # (logits, None)
        loss = loss_fn(output, yr)
    scaler.scale(loss).backward()  # the reducer runs here
    if rep.delayed:  # NOTE [ Delayed scaling on N ranks ] 2-3
        rep.amax = amax_vector(rep.delayed)
        update_scales(rep.delayed, reduce_amax(rep.amax.clone(), rep.ddp.process_group))
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
    live tensors and a template for load_sharded fills them in place; BF16SR's bfloat16
    moments are widened to float32 copies instead (exact; load_optimizer_state narrows)."""
    state: dict[str, torch.Tensor] = {}
    for i, p in enumerate(_keys(optimizer, params)):
        s = optimizer.state[p]
        if not s:  # AdamW's lazy initialization, ahead of its first step
            s["step"] = torch.tensor(0.0, dtype=torch.float32)
            s["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            s["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state[f"optim/step/{i}"] = s["step"]
        state[f"optim/exp_avg/{i}"] = s["exp_avg"].float()  # the same tensor if float32
        state[f"optim/exp_avg_sq/{i}"] = s["exp_avg_sq"].float()
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
    for i, p in enumerate(_keys(optimizer, params)):
        s = optimizer.state[p]
        for name in ("step", "exp_avg", "exp_avg_sq"):
            value = state[f"optim/{name}/{i}"]
            if s.get(name) is not value:
                s[name] = value.detach().to(torch.float32 if name == "step" else p.dtype,
                                            copy=True)
    lr = float(state["optim/lr"])
    for group in optimizer.param_groups:
        group["lr"] = lr
    sd = scheduler.state_dict()
    sd.update(last_epoch=int(state["sched/last_epoch"]),
              _step_count=int(state["sched/step_count"]), _last_lr=[lr])
    scheduler.load_state_dict(sd)


def _keys(optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter]) -> list:
    """The tensors the optimizer keys its state by: BF16SR's bfloat16 copies, else `params`."""
    return list(optimizer.param_groups[0]["params"]) if isinstance(optimizer, BF16SR) \
        else list(params)


def bits_state(rep: Replica, rank: int) -> dict[str, torch.Tensor]:
    """The rank's BitStream entry of its saved state ({} where it draws none): bits_key's
    key, bits_tensor of its state."""
    if rep.bits is None:
        return {}
    return {bits_key(rep.config.precision, rank): bits_tensor(rep.bits.state())}


def bits_tensor(state: dict[str, Any]) -> torch.Tensor:
    """A PCG64 state (BitStream.state()) as 37 uint8: state and inc (128 bits each, little
    endian), has_uint32 (1 byte) and uinteger (32 bits)."""
    s = state["state"]
    raw = (s["state"].to_bytes(16, "little") + s["inc"].to_bytes(16, "little")
           + bytes([state["has_uint32"]]) + state["uinteger"].to_bytes(4, "little"))
    return torch.tensor(list(raw), dtype=torch.uint8)


def bits_dict(t: torch.Tensor) -> dict[str, Any]:
    """bits_tensor's inverse: the PCG64 state BitStream.load takes."""
    raw = bytes(t.tolist())
    return {"bit_generator": "PCG64",
            "state": {"state": int.from_bytes(raw[:16], "little"),
                      "inc": int.from_bytes(raw[16:32], "little")},
            "has_uint32": raw[32], "uinteger": int.from_bytes(raw[33:37], "little")}
