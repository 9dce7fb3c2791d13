"""The compact transformer (reference/gpt.py) trained fully sharded (FSDP2) over simulated
ranks, with AdamW per shard: one step, each rank's sharded state, and the run of
`train --world-size N --model gpt --parallel fsdp`. torch_impl/fsdp_gpt.py is the same on
the real engine (every block and the root fully_shard'ed). The shards, the all-gather and
the reduce-scatter are reference/fsdp.py's (NOTE [ FSDP2's shards ], NOTE [ FSDP2's
all-gather ], NOTE [ FSDP2's reduce-scatter on gloo ]); nothing in them depends on the
model but which parameters form each fully_shard module (`groups`).

One step over ws simulated ranks (the parameters live only as padded shards):

    all_gather:  every parameter from the ranks' shards, cast to param_dtype (bf16, fp16:
                 one rounding; fp32: a copy)
    for rank r:  the gathered parameters into rank r's replica; forward of the GPT on
                 shard(x, r), its own float32 cross-entropy; backward of S * loss (S: the
                 scaler's scale, fp16; else 1); the local gradients in param_dtype
    reduce_scatter per fully_shard module (each block; the root: wte, wpe, ln_f, lm_head):
                 float32 buffers, the ring, ReduceOp.AVG's division by ws
    fp8-delayed: reduce_amax of every rank's amax_vector; update_scales on every rank
                 (NOTE [ Scaled GEMMs under FSDP2 ] 3)
    fp16:        each rank's unscale_ of its own rows (g <- g * f32(1/S); found_inf_r: an
                 inf or NaN among them), found_inf all-reduced (NOTE [ found_inf under
                 FSDP2 ]), so every rank skips or steps together
    for rank r:  AdamW on its unpadded rows unless found_inf (elementwise: each element as
                 the unsharded AdamW would); the scale's update; the run then steps each
                 rank's schedule unless the step was skipped

# NOTE [ Scaled GEMMs under FSDP2 ]
`--parallel fsdp --precision P` for the scaled precisions of common/fp8_train.py:
1. The all-gather stays in high precision: float32 parameters, no MixedPrecisionPolicy (a
   scaled precision runs without autocast in one process: all but its scaled GEMMs is
   float32); the reduce-scatter is float32's, as today.
2. Each rank's ScaledLinear casts the GATHERED full weight W (FSDP2 puts the unsharded
   parameter in the module before its forward; here the gathered one is copied into each
   replica), so every rank's weight scales agree, as under DDP where W is replicated; it
   casts its own shard's x and g, scaled from them alone (NOTE [ Delayed scaling on N
   ranks ]: current scaling reduces nothing).
3. fp8-delayed: each layer's update deferred (defer_scale_updates), the ranks' amax
   vectors reduced with MAX after the backward (reduce_amax, NaN kept), update_scales on
   every rank (reference/ddp_gpt.py's, unchanged). The histories and scales are module
   buffers, which fully_shard does not shard: model/<name> entries replicated on every
   rank (equal by the reduction), so they reshard as a read.
4. nvfp4: rank r draws from its own BitStream, as under DDP (NOTE [ Random bits on N
   ranks ] 2): bits/rank<r>, restored at the same world size, re-derived at another.
Not built: torchao's float8 all-gather (float8/fsdp_utils.py: each rank casts its SHARD of
W to float8 before the all-gather, with a scale from the amax all-reduced over the shards,
so the weight crosses the wire in fp8): another mechanism, the cast moved before the
gather. bf16-sr stays refused: its AdamWSR over a rank's rows would draw the shared stream
for those rows only, so the ranks' streams would part (NOTE [ Random bits on N ranks ] 1).

# NOTE [ found_inf under FSDP2 ]
A rank's sharded gradient holds only its rows of the reduced sum: an inf that one rank's
local gradient carried reaches the rows of the one rank that owns that element, and only
that rank's unscale_ sees it (unlike DDP, where every rank holds the whole sum: NOTE
[ found_inf is per rank ] in reference/ddp_scaler.py). Left per rank, that rank would skip
and halve its scale while the others step. On torch 2.13 the flag is all-reduced twice:
the DTensor dispatch of `_amp_foreach_non_finite_check_and_unscale_` (its
found_inf_reduce_handler) takes found_inf as Partial("max") over the mesh and makes it
full (MAX: 1 on every rank if any rank found one), then ShardedGradScaler.unscale_
all-reduces it with ReduceOp.SUM on its process group (ws). Step and update ask only
whether it is nonzero (ShardedGradScaler's CPU update: found_inf >= 1 backs off), so
every rank skips and updates alike; the reference runs both all-reduces
(reference.ddp_scaler.sync_found_inf, "max" then "sum": 0 or ws, exact).

What the reference does otherwise than the engine: under bf16 (fp16) torch runs every op
of the forward and backward in bfloat16 (float16; the parameters are param_dtype: no
autocast); the reference runs its GPT under its autocast emulation (reference/amp.py:
low-precision matmuls, float32 elsewhere) on the rounded weights, then rounds its
gradients to param_dtype. Its own
local gradients are never torch's bits (a BLAS order, and this); what the claims hold bit
for bit replays the torch ranks' local gradients (`local_grads`).

The run (`train`): fp16 with a loss scaler per rank (the same on every rank: the repaired
found_inf); --recompute as the single-process run's (each replica's blocks: the same bits
as without); a checkpoint every K steps saves each rank's own rows
(model/<name>, AdamW's buffers of its shard) beside the replicated entries (the scaler's
scale and growth tracker among them), in reference/sharded_ckpt.py's containers; a resume
at another world size joins the saved rows and cuts them anew (reference/fsdp_gpt_ckpt.py,
NOTE [ Resharding an FSDP checkpoint ]). The digest is gpt_rank_digest of the joined state
(every rank's rows concatenated; bf16 and fp32: the disabled scaler's scale 1, tracker 0).
--async-save: the same containers and record through reference/async_ckpt.py's AsyncSaver
(the DDP run's): every rank's state staged (copied) before save returns, written and
committed by a background thread while the ranks train on, pruned after the commit; the
next save, and the end of the run before its digest, wait for the commit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ckpt import commit_policy
from ckpt.policy import due
from common.ddp_bits import rank_bits
from common.ddp_gpt_state import gpt_rank_digest
from common.fp8_train import SCALED_PRECISIONS, autocast_precision
from common.recipes_train import BitStream
from common.train_config import OPTIMIZERS, TrainConfig
from common.train_loop import RanksResult, batches
from reference import amp, ddp_gpt, loss_scaling, optim
from reference import ddp as rddp
from reference import fsdp as rfsdp
from reference import sharded_ckpt as sharded
from reference.async_ckpt import AsyncSaver, save_step
from reference.ddp_scaler import sync_found_inf
from reference.fsdp_gpt_ckpt import apply_loaded, digest_state, load_ranks, rank_state
from reference.gpt import GPT
from reference.module import Parameter
from reference.state_digest import as_array
from reference.train import _make_scheduler
from reference.train_models import batch_of, build

PRECISIONS = ("fp32", "bf16", "fp16", *SCALED_PRECISIONS)  # not bf16-sr (NOTE below)
PAYLOAD = sharded.PAYLOAD
PARAM_DTYPES = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}


def param_dtype(precision: str) -> Any:
    """What the all-gather casts to: bf16's and fp16's param_dtype; float32 for fp32 and every
    scaled precision (NOTE [ Scaled GEMMs under FSDP2 ] 1)."""
    return PARAM_DTYPES[autocast_precision(precision)]


def groups(n_layer: int) -> list[list[int]]:
    """The fully_shard modules' parameter indices: each block's 12 (ddp_gpt.BLOCK_PARAMS),
    then the root's own (wte, wpe, ln_f's weight and bias, lm_head)."""
    b = ddp_gpt.BLOCK_PARAMS
    head = 2 + b * n_layer
    return [list(range(2 + b * k, 2 + b * (k + 1))) for k in range(n_layer)] + [
        [0, 1, head, head + 1, head + 2]]


@dataclass
class Ranks:
    """ws simulated FSDP ranks of the GPT: each one's replica (its parameters overwritten by
    the gathered ones every step; its dropout stream), padded shards [rank][param], the
    Parameters viewing their unpadded rows, AdamW on them, the schedule and the loss scaler
    (enabled for fp16 only)."""

    replicas: list[GPT]
    padded: list[list[np.ndarray]]
    shards: list[list[Parameter]]
    optimizers: list[optim.AdamW]
    schedulers: list[Any]
    scalers: list[loss_scaling.GradScaler]
    rngs: list[np.random.Generator]  # each replica's dropout stream
    parts: Any  # rank 0's build: the loader of the global batch, the sampler
    config: TrainConfig
    bits: list[BitStream | None]  # each rank's (nvfp4): NOTE [ Random bits on N ranks ]


def simulated_ranks(c: TrainConfig, world_size: int, initial: Sequence[np.ndarray] | None = None,
                    **adamw: Any) -> Ranks:
    """ws ranks of `c`'s GPT sharding `initial` (default: the seed's weights); `adamw`:
    reference.optim.AdamW's arithmetic options (the replay's fma and sqrt)."""
    if c.model != "gpt" or c.precision not in PRECISIONS:
        raise ValueError(f"fsdp_gpt: the GPT in {PRECISIONS}, got {c.model!r}, "
                         f"{c.precision!r}")
    ws, replicas, rngs, bits, parts0 = world_size, [], [], [], None
    for r in range(ws):
        rng = np.random.default_rng(c.seed)  # the weights: the same on every rank
        bits.append(rank_bits(c.seed, c.precision, r))
        parts = build(c, rng, bits[-1])
        rng.bit_generator.state = sharded.rank_stream(c.seed, r, 0)  # its dropout stream
        replicas.append(parts.model)
        rngs.append(rng)
        parts0 = parts0 or parts
    full = [p.data.copy() for p in replicas[0].parameters()] if initial is None else initial
    padded = [[rfsdp.shard(np.asarray(p), r, ws) for p in full] for r in range(ws)]
    shards = [[Parameter(rfsdp.unpadded(padded[r][i], p.shape[0], r, ws))  # views
               for i, p in enumerate(full)] for r in range(ws)]
    optimizers = [optim.AdamW(ps, lr=c.lr, **OPTIMIZERS["AdamW"], **adamw) for ps in shards]
    schedulers = [_make_scheduler(opt, c) for opt in optimizers]
    scalers = [loss_scaling.make_scaler(autocast_precision(c.precision), init_scale=c.init_scale,
                                        growth_interval=c.growth_interval) for _ in range(ws)]
    return Ranks(replicas, padded, shards, optimizers, schedulers, scalers, rngs, parts0, c,
                 bits)


@dataclass
class StepRecord:
    """One FSDP step of the GPT over the simulated ranks: the gathered parameters [param],
    the local gradients used [rank][param] (param_dtype), the sharded gradients
    [rank][param] (float32, still scaled), each rank's shard loss, and per rank the scale
    the step used, the found_inf it read (after both all-reduces), whether it skipped;
    fp8-delayed: each rank's amax vector before the reduction [rank] (else empty)."""

    gathered: list[np.ndarray]
    local: list[list[np.ndarray]]
    grads: list[list[np.ndarray]]
    losses: list[float]
    scale: list[float]
    found_inf: list[float]
    skipped: list[bool]
    amax: list[np.ndarray]


def fsdp_step(ranks: Ranks, x: np.ndarray, y: np.ndarray, *, precision: str,
              local_grads: Callable[[int], list[np.ndarray]] | None = None,
              local_amax: Callable[[int], np.ndarray] | None = None) -> StepRecord:
    """One FSDP step over the simulated ranks (the module docstring); `local_grads(rank)`,
    if given, replaces rank's own local gradients, `local_amax(rank)` its amax vector (a
    replay of the torch ranks'). A scaled fp16 backward may overflow on purpose (the
    scaler's check is how the ranks find out), so NumPy's overflow and invalid warnings are
    silenced here."""
    ws, dt, scalers = len(ranks.padded), param_dtype(precision), ranks.scalers
    shapes = [p.data.shape for p in ranks.replicas[0].parameters()]
    gathered = [rfsdp.all_gather([ranks.padded[r][i] for r in range(ws)], shape, dt)
                for i, shape in enumerate(shapes)]
    local, losses = [], []
    delayed = [ddp_gpt.defer_scale_updates(model) for model in ranks.replicas]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for rank, model in enumerate(ranks.replicas):
            model.zero_grad()
            for p, g in zip(model.parameters(), gathered, strict=True):
                np.copyto(p.data, g.astype(p.data.dtype))  # bf16, fp16: exact in float32
            xr, yr = rddp.shard(x, rank, ws), rddp.shard(y, rank, ws)  # (B/ws, T) token ids
            with amp.autocast(amp.autocast_dtype(autocast_precision(precision))):
                _, loss = model.forward(xr, yr)  # its own float32 cross-entropy
            model.backward(scalers[rank].scale(np.ones_like(loss)))
            own = [p.grad.astype(dt) for p in model.parameters()]
            local.append(own if local_grads is None else local_grads(rank))
            losses.append(float(loss))
        amax = [ddp_gpt.amax_vector(layers) if local_amax is None else local_amax(r)
                for r, layers in enumerate(delayed)] if delayed[0] else []
        if amax:  # NOTE [ Scaled GEMMs under FSDP2 ] 3
            reduced = ddp_gpt.reduce_amax(amax)
            for layers in delayed:
                ddp_gpt.update_scales(layers, reduced)
    grads: list[list[Any]] = [[None] * len(shapes) for _ in range(ws)]
    for group in groups(ranks.replicas[0].config.n_layer):  # one reduce-scatter per module
        rows = rfsdp.reduce_scatter([[local[r][i] for i in group] for r in range(ws)],
                                    np.float32)
        for r in range(ws):
            for i, g in zip(group, rows[r], strict=True):
                grads[r][i] = g
    record = StepRecord(gathered, local, grads, losses, [], [], [], amax)
    for r in range(ws):
        for p, g in zip(ranks.shards[r], grads[r], strict=True):
            p.grad = g.copy()
        record.scale.append(scalers[r].get_scale())
    _optimizer_phase(ranks, record)
    return record


def _optimizer_phase(ranks: Ranks, record: StepRecord) -> None:
    """NOTE [ found_inf under FSDP2 ]: every rank's unscale_ of its own rows, found_inf
    all-reduced twice (MAX, then SUM), AdamW unless it is nonzero, the scale's update."""
    scalers, optimizers = ranks.scalers, ranks.optimizers
    if scalers[0].is_enabled():
        for scaler, optimizer in zip(scalers, optimizers, strict=True):
            scaler.unscale_(optimizer)  # found_inf: inf or NaN in this rank's rows
        sync_found_inf(scalers, optimizers, "max")  # the DTensor op's Partial("max")
        sync_found_inf(scalers, optimizers, "sum")  # ShardedGradScaler.unscale_'s SUM
    for scaler, optimizer in zip(scalers, optimizers, strict=True):
        enabled = scaler.is_enabled()
        record.found_inf.append(float(scaler._found_inf_per_device(optimizer)["cpu"])
                                if enabled else 0.0)
        scaler.step(optimizer)
        record.skipped.append(loss_scaling.step_skipped(scaler, optimizer))
        scaler.update()


def train(config: TrainConfig, steps: int, world_size: int, directory: str | Path,
          every: int, *, keep: int, start: commit_policy.Start,
          log: Callable[[str], None], async_save: str | None = None) -> RanksResult:
    """Run the N-rank FSDP training (the module docstring) from `start` to `steps`;
    `async_save` ("copy"): the checkpoints saved by a background thread."""
    c, ws = config, world_size
    ranks = simulated_ranks(c, ws)
    sampler, step, skipped = ranks.parts.sampler, 0, 0
    if start.record is not None:
        record, states = load_ranks(directory, ws, c.seed)  # resharded if ws differs
        if record.step != start.record.step:
            raise RuntimeError(f"{directory}: its newest commit is step {record.step}, the "
                               f"command chose step {start.record.step} (changed since?)")
        for rank, state in enumerate(states):
            apply_loaded(state, ranks, rank)
        sampler.load_state_dict({**sampler.state_dict(), "epoch": int(states[0]["data/epoch"]),
                                 "position": int(states[0]["data/position"])})
        step, skipped = int(states[0]["step"]), int(states[0]["skipped"])
    data = batches(c, ranks.parts.loader, batch_of)  # from the sampler's (restored) position
    saver = None if async_save is None else AsyncSaver()
    while step < steps:
        x, y = next(data)
        record = fsdp_step(ranks, x, y, precision=c.precision)
        for scheduler in ranks.schedulers if not record.skipped[0] else ():
            scheduler.step()  # the schedule counts applied updates
        step, skipped = step + 1, skipped + int(record.skipped[0])
        mean = sum(np.float64(loss) for loss in record.losses) / ws
        log(f"step {step} loss {float(mean):.6g} scale {record.scale[0]:g} skipped "
            f"{int(record.skipped[0])} (total {skipped})")
        if not due(step, steps, every):
            continue
        states = [rank_state(ranks, r, step, skipped) for r in range(ws)]
        config = {**c.to_dict(), "parallel": "fsdp"}
        save_step(directory, step, states, saver=saver, config=config, keep=keep)
    if saver is not None:
        saver.close()  # the last save committed (or its error raised) before the digest
    joined = digest_state([rank_state(ranks, r, step, skipped) for r in range(ws)])
    return RanksResult(step, gpt_rank_digest(joined, as_array), skipped)
