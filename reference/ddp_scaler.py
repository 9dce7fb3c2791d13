"""Loss scaling across data-parallel ranks: a GradScaler per rank, the found_inf that DDP
never synchronizes, a seeded fault that shows it, and the all-reduce that repairs it.
torch_impl/ddp_scaler.py runs the same on the real engine; the reducer and the ring are
reference/ddp.py's, the scaler reference/loss_scaling.py's.

# NOTE [ found_inf is per rank ]
Under DDP every rank holds its own GradScaler, and nothing ties them together: DDP
all-reduces gradients, never the scaler's state. Normally they agree anyway: the reduction
is a sum, and an inf or NaN on any rank's local gradient reaches every rank's reduced
gradient (inf + x = inf), so every rank's unscale_ finds it, every rank skips, every scale
halves. An inf that appears AFTER the reduction on one rank only (a post-reduction hook or
tamper, a rank-local gradient edit, a corrupted copy, clipping or a regularizer applied to
.grad on one rank) is seen by that rank alone: it skips its step and halves its scale, the
others step and keep theirs. No error is raised and no collective hangs (the step issues
none); from then on the ranks scale their losses differently, DDP averages gradients scaled
by different S, each rank unscales by its own S, and the models drift apart.

One step on rank r (the AMP recipe with DDP; [fault] and [repair] as `scaler_step` applies
them):

    scaler_r.scale(loss_r).backward()    # DDP: every rank's .grad = the same reduced g
    [fault]   rank f at step s: g[0].flat[0] <- +inf               (one rank, after it)
    scaler_r.unscale_(opt_r)             # found_inf_r = any(!isfinite(g)); g <- g * f32(1/S_r)
    [repair]  found_inf_r <- all_reduce(found_inf_r, MAX or SUM)   (every rank, before step)
    scaler_r.step(opt_r)                 # skipped iff found_inf_r != 0
    scaler_r.update()                    # found_inf_r != 0: S_r <- S_r / 2, tracker <- 0

With the repair every rank's flag is the same (0 if no rank found one; else >= 1), so every
rank skips together and updates its scale alike: the ranks stay bit-identical. MAX keeps the
flag 0 or 1; SUM (torch's ShardedGradScaler, which all-reduces found_inf in its unscale_)
counts the ranks that found one; step and update ask only whether it is nonzero, so both
repair ("sharded", torch's ShardedGradScaler, is its SUM: the reference runs its "sum"). The
all-reduce mirrors gloo: SUM is ring_allreduce of a 1-element float32 buffer, MAX is exact in
any order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from common import rank_check
from common.arg_ranges import SCALER_REPAIR_ERROR, SCALER_REPAIRS
from reference import loss_scaling
from reference.ddp import local_backward, reduce_into, ring_allreduce
from reference.losses import Loss
from reference.nn import Module

# the declared range (common/arg_ranges.py), the torch tree's: "sharded" is ShardedGradScaler's
# all-reduce (ReduceOp.SUM in its unscale_), which the reference runs as its "sum"
REPAIRS = SCALER_REPAIRS
_REDUCE_OPS = {"max": "max", "sum": "sum", "sharded": "sum"}


def check_repair(repair: str) -> None:
    """The check scaler_step makes: `repair` one of REPAIRS, else torch's tree's line."""
    if not isinstance(repair, str) or repair not in REPAIRS:
        raise ValueError(SCALER_REPAIR_ERROR.format(REPAIRS, repair))


def tamper_(grads: Sequence[np.ndarray]) -> None:
    """The seeded fault: the first element of the first parameter's gradient becomes +inf."""
    grads[0].reshape(-1)[0] = np.inf


def sync_found_inf(scalers: Sequence[loss_scaling.GradScaler], optimizers: Sequence,
                   op: str) -> None:
    """Every rank's found_inf (filled by unscale_) replaced in place by the all-reduce `op`
    ("max" or "sum") of all of them, as dist.all_reduce does to the torch scaler's tensor."""
    flags = [scaler._found_inf_per_device(opt)["cpu"] for scaler, opt in
             zip(scalers, optimizers, strict=True)]
    if op == "sum":
        totals = ring_allreduce([f.reshape(1) for f in flags])
    elif op == "max":
        totals = [np.maximum.reduce([f.reshape(1) for f in flags])] * len(flags)
    else:
        raise ValueError(f"sync_found_inf: op must be 'max' or 'sum', got {op!r}")
    for flag, total in zip(flags, totals, strict=True):
        flag[...] = total.reshape(())


@dataclass
class ScalerRecord:
    """One step of every rank: the local gradients reduced, the found_inf each scaler.step
    used, the scale each step used, whether it skipped, and the rank states after update
    (rank_check.RankState) with the cross-rank check's verdict (None: the ranks agree)."""

    local: list[list[np.ndarray]]
    own: list[list[np.ndarray]]
    found_inf: list[float]
    scale: list[float]
    skipped: list[bool]
    states: list[rank_check.RankState] = field(default_factory=list)
    divergence: str | None = None


def scaler_step(replicas: Sequence[Module], loss_fn: Loss, optimizers: Sequence,
                scalers: Sequence[loss_scaling.GradScaler], x: np.ndarray, y: np.ndarray, *,
                step: int, precision: str, fault: tuple[int, int] | None = None,
                repair: str = "none",
                local_grads: Callable[[int], list[np.ndarray]] | None = None) -> ScalerRecord:
    """One DDP step with a GradScaler per rank (NOTE [ found_inf is per rank ]'s recipe):
    local_backward and reduce_into as reference.ddp.ddp_step; then `fault` (rank, step)
    tampers that rank's reduced gradient at that step; each rank's unscale_; `repair` "max"
    or "sum" ("sharded": as "sum") all-reduces found_inf ("none": it stays per rank); each
    rank's step and update;
    then the cross-rank check (rank_check) on every rank's state."""
    rank_check.check_fault(fault, len(replicas))
    check_repair(repair)
    _, local, own, _ = local_backward(replicas, loss_fn, optimizers, scalers, x, y,
                                      precision=precision, local_grads=local_grads)
    reduce_into(replicas, local, step=step, precision=precision)
    if fault is not None and fault[1] == step:
        tamper_([p.grad for p in replicas[fault[0]].parameters()])
    for rank in range(len(replicas)):
        scalers[rank].unscale_(optimizers[rank])
    if repair != "none":
        sync_found_inf(scalers, optimizers, _REDUCE_OPS[repair])
    record = ScalerRecord(local, own, [], [], [])
    for rank, model in enumerate(replicas):
        scaler, optimizer = scalers[rank], optimizers[rank]
        record.scale.append(scaler.get_scale())
        record.found_inf.append(float(scaler._found_inf_per_device(optimizer)["cpu"]))
        scaler.step(optimizer)
        record.skipped.append(loss_scaling.step_skipped(scaler, optimizer))
        scaler.update()
        record.states.append(rank_check.RankState(
            record.found_inf[-1], scaler.get_scale(),
            rank_check.digest(scaler.get_scale(), [p.data for p in model.parameters()])))
    record.divergence = rank_check.divergence(step, record.states)
    return record
