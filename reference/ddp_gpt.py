"""The compact transformer (reference/gpt.py) trained data-parallel over simulated ranks, with
AdamW: one DDP step of the GPT, the order its gradients become ready (which lays out DDP's
bucket), and the rank's AdamW and schedule entries of a sharded checkpoint.
torch_impl/ddp_gpt.py is the same step on the real engine. The reduction itself is
reference/ddp.py's (NOTE [ DDP's reducer ], NOTE [ gloo's ring segments ]): nothing about
it depends on the model but the ready order.

One step over ws simulated ranks (reference/train.py's train_step, split where DDP cuts it):

    for rank r:  zero_grad; autocast forward of the GPT on shard(x, r), its own float32
                 cross-entropy; backward of S_r * loss          (S_r: rank r's GradScaler)
    reducer:     step_buckets(sizes, step, ready_order(...)); reduce_gradients (f32(1/ws)
                 pre-division, the ring) into every rank's .grad
    fp8-delayed: reduce_amax of every rank's amax_vector; update_scales on every rank
                 (NOTE [ Delayed scaling on N ranks ])
    for rank r:  unscale_, AdamW step unless inf/NaN, update S_r
                 (the run then steps each rank's schedule unless the step was skipped)

# NOTE [ The GPT's ready order ]
DDP rebuilds its buckets after the first backward in the order the gradients became ready
(NOTE [ DDP's reducer ] 2). For the compact GPT (parameters: wte, wpe, then per block ln_1,
attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, each weight then bias, then ln_f and
lm_head) torch's engine makes them ready last module first: lm_head, ln_f, then each block
from the last (mlp.c_proj, mlp.c_fc, ln_2, attn.c_proj, attn.c_attn, ln_1), then wpe, wte.
Within a module, a LayerNorm's weight before its bias; a Linear's bias before its weight in
float32 (the bias's AccumulateGrad hangs off AddmmBackward, the weight's behind TBackward),
its weight first under autocast (both behind a ToCopyBackward), as for the MLP
(reference.ddp.ready_order). Recomputation (per block or selective) does not change it:
a checkpointed block's gradients are made in the same order when it is replayed. Observed
with torch 2.13 and held to the buckets DDP itself reports (claim ddp.gpt_buckets). The
whole GPT of the train command is about 200 KB, under the first bucket's 1 MiB: from step 2
on it is one bucket in this order, and from three ranks on that order decides which ring
chunk, so which summation order, each element gets.
A scaled precision (common/fp8_train.py) and bf16-sr run no autocast: their order is
float32's (a ScaledLinear's bias hangs off the `+ b` after its scaled GEMM, its weight off
the GEMM's own backward, so the bias is ready first, as in float32).

# NOTE [ Delayed scaling on N ranks ]
Transformer Engine's DelayedScaling(reduce_amax=True) (transformer_engine/pytorch/
quantization.py, FP8GlobalStateManager.reduce_and_update_fp8_tensors): the amaxes every
module recorded this step are concatenated into one buffer, all-reduced with MAX over the fp8
group (the autocast's fp8_group, by default every rank), and only then is each history rolled
and each scale recomputed. So every rank casts the next step with the scale of the GLOBAL
amax (the max over all shards), and the ranks' histories and scales, which are model buffers
and so replicated entries of the checkpoint, stay equal. Here, on N ranks:
1. each fp8-delayed ScaledLinear records its amaxes in slot 0 as in one process (the input x
   of its own shard, the replicated W, its own g), but its end-of-backward update is
   deferred (defer_scale_updates): a layer's scales are read only by its own casts, all
   before its backward ends, so updating after the whole backward changes no cast of the
   step (at one rank it is the single-process run's update);
2. after the backward (DDP's gradient all-reduce done), every rank's slot-0 amaxes, layer by
   layer in module order and input, weight, grad_output in each (amax_vector), are reduced
   with MAX over the ranks (reduce_amax: dist.all_reduce(MAX) on the engine, a max over the
   simulated ranks here; a max is exact, in any order);
3. every rank writes the reduced amaxes into slot 0 and runs the layer's update
   (update_scales: fp8_scaling.delayed_update, as in one process).
A NaN amax (an overflow in some rank's shard) propagates: the reduced amax is NaN wherever
any rank's is, the canonical quiet NaN, so every rank keeps its previous scale
(delayed_update takes no non-finite amax), as one process does, whose amax over the whole
batch (torch.amax) is NaN then. gloo's MAX does not promise that: a NaN survives or is lost
by the element's place in the ring (measured, torch 2.13, 2 ranks, 3 elements: rank 0's
NaN survives at element 0 and is lost to rank 1's 1.0 at element 2; rank 1's the other way
round), so the engine carries a second row, where any rank had a NaN, in the same
all-reduce (torch_impl/ddp_gpt.py's reduce_amax).
The current-scaling recipes (tensorwise, rowwise, MX, blockwise, nvfp4) reduce nothing:
each rank scales its x and g from its own shard, as torchao's Float8Linear does under DDP
(hp_tensor_to_float8_dynamic with reduce_amax=False; torchao reduces an amax only for
FSDP's float8 weights, float8/fsdp_utils.py); W is replicated, so its scales agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from common.fp8_train import DELAYED_TENSORS, autocast_precision
from reference import amp
from reference import ddp as rddp
from reference.fp8_train import ScaledLinear
from reference.gpt import GPT
from reference.recipes_train import BF16SR
from reference.train import _optimizer_phase

BLOCK_PARAMS = 12  # ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj: a weight and a bias each


def ready_order(n_layer: int, precision: str) -> list[int]:
    """The order the compact GPT's gradients become ready in backward (NOTE [ The GPT's
    ready order ]), as parameter indices (untied weights, biases on)."""
    autocast = amp.autocast_dtype(autocast_precision(precision)) is not None

    def linear(w: int) -> list[int]:
        return [w, w + 1] if autocast else [w + 1, w]

    head = 2 + BLOCK_PARAMS * n_layer  # ln_f.weight; lm_head.weight follows its bias
    order = [head + 2, head, head + 1]
    for layer in reversed(range(n_layer)):
        b = 2 + BLOCK_PARAMS * layer
        order += [*linear(b + 10), *linear(b + 8), b + 6, b + 7, *linear(b + 4),
                  *linear(b + 2), b, b + 1]
    return [*order, 1, 0]


def check_model(model: GPT) -> None:
    """ValueError unless `model` has the parameter list ready_order describes."""
    c = model.config
    if not c.bias or c.tie_weights:
        raise ValueError("ddp_gpt: the ready order is written for biases on and untied "
                         f"weights, got bias={c.bias}, tie_weights={c.tie_weights}")


def local_backward(replicas: Sequence[GPT], optimizers: Sequence, scalers: Sequence,
                   x: np.ndarray, y: np.ndarray, *, precision: str,
                   local_grads: Callable[[int], list[np.ndarray]] | None = None
                   ) -> tuple[list, list, list, list[float]]:
    """Each rank as reference.train.train_step's GPT branch up to its backward: (rows, local,
    own, losses) per rank; `local_grads(rank)`, if given, replaces rank's gradients (a replay
    of the torch ranks': reference.ddp.ddp_step)."""
    ws, dtype = len(replicas), amp.autocast_dtype(autocast_precision(precision))
    rows, local, own, losses = [], [], [], []
    for rank, model in enumerate(replicas):
        optimizers[rank].zero_grad()
        xr, yr = rddp.shard(x, rank, ws), rddp.shard(y, rank, ws)  # (B/ws, T) token ids
        rows.append((xr, yr))
        with amp.autocast(dtype):
            _, loss = model.forward(xr, yr)  # its own float32 cross-entropy
        model.backward(scalers[rank].scale(np.ones_like(loss)))
        own.append([p.grad for p in model.parameters()])
        local.append(own[-1] if local_grads is None else local_grads(rank))
        losses.append(float(loss))
    return rows, local, own, losses


def defer_scale_updates(model: GPT) -> list[ScaledLinear]:
    """NOTE [ Delayed scaling on N ranks ] 1: the model's fp8-delayed ScaledLinears, in module
    order, their end-of-backward update deferred to update_scales (idempotent)."""
    layers = [m for m in model.modules() if isinstance(m, ScaledLinear) and m.recipe.delayed]
    for layer in layers:
        object.__setattr__(layer, "_update", _deferred)
    return layers


def _deferred() -> None:
    """A deferred layer's update at the end of its backward: nothing (update_scales runs it)."""


def amax_vector(layers: Sequence[ScaledLinear]) -> np.ndarray:
    """This step's amaxes (slot 0 of every history), layer by layer, DELAYED_TENSORS in each."""
    return np.array([layer.buffers_of()[f"fp8_amax_history_{t}"][0] for layer in layers
                     for t in DELAYED_TENSORS], dtype=np.float32)


def reduce_amax(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """The ranks' amax vectors reduced with MAX, element by element (exact in any order), a
    NaN of any rank kept as the canonical quiet NaN (NOTE [ Delayed scaling on N ranks ])."""
    top = np.maximum.reduce([np.asarray(v, dtype=np.float32) for v in vectors])
    return np.where(np.isnan(top), np.float32(np.nan), top)


def update_scales(layers: Sequence[ScaledLinear], amax: np.ndarray) -> None:
    """NOTE [ Delayed scaling on N ranks ] 3: slot 0 of every history set to the reduced
    amax, then every layer's delayed update (roll, amax, scale)."""
    values = iter(amax)
    for layer in layers:
        for t in DELAYED_TENSORS:
            layer.buffers_of()[f"fp8_amax_history_{t}"][0] = next(values)
        ScaledLinear._update(layer)


def ddp_step(replicas: Sequence[GPT], optimizers: Sequence, scalers: Sequence,
             x: np.ndarray, y: np.ndarray, *, step: int, precision: str,
             local_grads: Callable[[int], list[np.ndarray]] | None = None,
             local_amax: Callable[[int], np.ndarray] | None = None) -> rddp.StepRecord:
    """One DDP step of the GPT over len(replicas) simulated ranks (the module docstring);
    `step` (1-based) picks DDP's buckets (one in parameter order at 1, the ready order's
    after). fp8-delayed: the ranks' amaxes reduced before the scale update (NOTE [ Delayed
    scaling on N ranks ]); `local_amax(rank)`, if given, replaces rank's amax vector (a
    replay of the torch ranks'). A scaled fp16 backward may overflow on purpose: the
    scaler's inf/NaN check is how every rank finds out, so NumPy's overflow and invalid
    warnings are silenced here."""
    for model in replicas:
        check_model(model)
    delayed = [defer_scale_updates(model) for model in replicas]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        rows, local, own, losses = local_backward(replicas, optimizers, scalers, x, y,
                                                  precision=precision, local_grads=local_grads)
        if delayed[0]:  # NOTE [ Delayed scaling on N ranks ] 2-3
            amax = reduce_amax([amax_vector(layers) if local_amax is None else local_amax(r)
                                for r, layers in enumerate(delayed)])
            for layers in delayed:
                update_scales(layers, amax)
        sizes = [g.nbytes for g in local[0]]
        order = ready_order(replicas[0].config.n_layer, precision)
        buckets = rddp.step_buckets(sizes, step, order)
        reduced = rddp.reduce_gradients(local, buckets)
        for model in replicas:
            for p, g in zip(model.parameters(), reduced, strict=True):
                p.grad = g.copy()
        record = rddp.StepRecord(rows, local, own, reduced, buckets)
        for rank, model in enumerate(replicas):
            record.results.append(_optimizer_phase(model, optimizers[rank], scalers[rank],
                                                   losses[rank], None, None))
    return record


def _keys(optimizer: Any, params: Sequence) -> list:
    """The parameters the optimizer keys its state by: BF16SR's own bfloat16 copies (its
    param_groups), AdamW's the model's `params`."""
    return list(optimizer.param_groups[0]["params"]) if isinstance(optimizer, BF16SR) \
        else list(params)


def optimizer_state(optimizer: Any, scheduler: Any, params: Sequence) -> dict[str, Any]:
    """AdamW's and the schedule's entries of a rank's sharded state (the table in
    torch_impl/sharded_ckpt.py): optim/step/<i> (float32), optim/exp_avg/<i>,
    optim/exp_avg_sq/<i> (zeros before the first step, as torch's lazy state starts; float32,
    bf16-sr's bfloat16 moments widened, exact, as BF16SR.state_dict widens them),
    optim/lr (the group's current lr, float64: the recursive schedule reads it),
    sched/last_epoch and sched/step_count."""
    state: dict[str, Any] = {}
    for i, p in enumerate(_keys(optimizer, params)):
        s = optimizer.state.get(p) or {}
        state[f"optim/step/{i}"] = np.array(s.get("step", 0.0), dtype=np.float32)
        for name in ("exp_avg", "exp_avg_sq"):
            value = np.zeros_like(p.data) if name not in s else s[name]
            state[f"optim/{name}/{i}"] = np.array(value, dtype=np.float32, copy=True)
    state["optim/lr"] = np.float64(optimizer.param_groups[0]["lr"])
    state["sched/last_epoch"] = np.int64(scheduler.last_epoch)
    state["sched/step_count"] = np.int64(scheduler._step_count)
    return state


def load_optimizer_state(state: dict[str, Any], optimizer: Any, scheduler: Any,
                         params: Sequence) -> None:
    """Set AdamW (or BF16SR, its moments narrowed back to bfloat16: exact) and the schedule
    from optimizer_state's entries."""
    for i, p in enumerate(_keys(optimizer, params)):
        optimizer.state[p] = {"step": np.array(state[f"optim/step/{i}"], dtype=np.float32)}
        for name in ("exp_avg", "exp_avg_sq"):
            optimizer.state[p][name] = np.asarray(state[f"optim/{name}/{i}"]).astype(
                p.data.dtype)
    lr = float(state["optim/lr"])
    for group in optimizer.param_groups:
        group["lr"] = lr
    sd = scheduler.state_dict()
    sd.update(last_epoch=int(state["sched/last_epoch"]),
              _step_count=int(state["sched/step_count"]), _last_lr=[lr])
    scheduler.load_state_dict(sd)
