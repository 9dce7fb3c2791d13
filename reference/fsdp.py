"""Fully sharded data parallel (FSDP2, torch.distributed.fsdp.fully_shard) over simulated
ranks: each rank keeps a dim-0 shard of every parameter, all-gathers the parameters before
a module's forward, and reduce-scatters the gradients after its backward, in gloo's order.
torch_impl/fsdp.py runs the real engine; this file is the same arithmetic in NumPy.

NOTE [ FSDP2's shards ]
torch/distributed/fsdp/_fully_shard/_fsdp_param.py, FSDPParam._init_sharded_param: a
parameter of shape (d0, ...) is cut by torch.chunk(d0, ws): c = ceil(d0 / ws) rows a chunk,
chunk k rows [k c, min((k + 1) c, d0)), and chunks past the end are EMPTY (torch.chunk
returns fewer than ws; _chunk_with_empty appends empty ones). Every rank stores its chunk
zero-padded to c rows (chunk 0's size); the optimizer sees the unpadded rows. So d0 = 5,
ws = 4 gives rows 2, 2, 1, 0, each stored as 2 rows. Only the last non-empty chunk is short,
so the padding of the gathered (ws c)-row tensor is all at its end.

NOTE [ FSDP2's all-gather ]
_fsdp_collectives.foreach_all_gather: each rank casts its padded shards to param_dtype
(bfloat16 here: one rounding, round-to-nearest-even), concatenates a module's parameters and
dist.all_gather_single's the flat buffer (a copy); each parameter is the first d0 rows of
its (ws c)-row block. With param_dtype the forward and backward run on these bf16 copies,
so the local gradients are bf16.

NOTE [ FSDP2's reduce-scatter on gloo ]
_fsdp_collectives.foreach_reduce, per fully_shard module (its own parameters only):
1. Copy-in: torch._chunk_cat of the local gradients into a (ws, -1) buffer of reduce_dtype:
   row r is the concatenation, over the module's parameters, of each gradient's chunk r
   zero-padded to c rows (a cast from bf16 to float32 is exact).
2. Divide factors (_get_gradient_divide_factors): for reduce_dtype float32 or bfloat16 there
   is no pre- or post-division: the op is ReduceOp.AVG. Only a dtype with overflow risk
   (float16) uses SUM with a pre-division by a power of two p (p doubles from 1 while
   ws % p == 0 and ws / p > p) and a post-division by ws / p, both `div_` in reduce_dtype,
   to keep the sum from overflowing. ws = 1: SUM, nothing divided.
3. dist.reduce_scatter_single on gloo (ProcessGroupGloo::reduce_scatter_tensor_coalesced):
   the whole flat buffer is ring all-reduced (reference.ddp.ring_allreduce: NOTE [ gloo's
   ring segments ] -- its chunks are the ring's, NOT the ranks' rows, so one rank's shard
   can be summed in two orders) and rank r copies out row r. ReduceOp.AVG: the ring's sum
   then divided by ws in reduce_dtype (bf16: the float32 quotient rounded, as torch's div).
   Checked against dist.reduce_scatter_single (parity/test_fsdp.py): ws 2-4, float32 and
   bfloat16, SUM and AVG, ws x 1 to ws x 600,001 elements (torch 2.13).
4. The row is cast to the parameter's dtype (float32: exact) and cut into the sharded
   gradients (each parameter's unpadded rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reference.ddp import ring_allreduce

OPS = ("sum", "avg")


def chunk_rows(d0: int, world_size: int) -> list[tuple[int, int]]:
    """The rows [lo, hi) of each rank's chunk of a dim-0 of d0 rows (NOTE [ FSDP2's shards ]);
    an empty chunk is (d0, d0)."""
    if world_size < 1 or d0 < 0:
        raise ValueError(f"chunk_rows: need world_size >= 1 and d0 >= 0, got {world_size}, {d0}")
    c = -(-d0 // world_size)
    return [(min(k * c, d0), min((k + 1) * c, d0)) for k in range(world_size)]


def padded_rows(d0: int, world_size: int) -> int:
    """c = ceil(d0 / ws): the rows every rank stores (chunk 0's)."""
    lo, hi = chunk_rows(d0, world_size)[0]
    return hi - lo


def _check_param(x: np.ndarray, where: str) -> None:
    if x.ndim < 1:
        raise ValueError(f"{where}: FSDP2 shards dim 0; a 0-d parameter has none")


def shard(x: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank `rank`'s padded shard of parameter x: its chunk's rows, zero rows to c."""
    _check_param(x, "shard")
    if not 0 <= rank < world_size:
        raise ValueError(f"shard: rank {rank} is not in 0..{world_size - 1}")
    lo, hi = chunk_rows(x.shape[0], world_size)[rank]
    out = np.zeros((padded_rows(x.shape[0], world_size), *x.shape[1:]), dtype=x.dtype)
    out[:hi - lo] = x[lo:hi]
    return out


def unpadded(padded: np.ndarray, d0: int, rank: int, world_size: int) -> np.ndarray:
    """The rows of a padded shard the optimizer sees (its chunk's, without the padding)."""
    lo, hi = chunk_rows(d0, world_size)[rank]
    return padded[:hi - lo]


def all_gather(shards: Sequence[np.ndarray], shape: tuple[int, ...], param_dtype: type
               ) -> np.ndarray:
    """The unsharded parameter every rank uses (NOTE [ FSDP2's all-gather ]): each rank's
    padded shard cast to param_dtype, concatenated in rank order, its first d0 rows."""
    if len(shards) < 1 or any(s.shape != shards[0].shape for s in shards):
        raise ValueError("all_gather: need one padded shard per rank, all of one shape")
    gathered = np.concatenate([np.asarray(s).astype(param_dtype) for s in shards])
    return gathered[:shape[0]].reshape(shape)


def divide_factors(world_size: int, reduce_dtype: type) -> tuple[float | None, float | None,
                                                                  str]:
    """(pre-divisor, post-divisor, op) of NOTE [ FSDP2's reduce-scatter on gloo ] 2."""
    if world_size < 1:
        raise ValueError(f"divide_factors: world_size must be >= 1, got {world_size}")
    if np.dtype(reduce_dtype) != np.dtype(np.float16):  # float32, bfloat16: no overflow risk
        return None, None, ("sum" if world_size == 1 else "avg")
    factor, pre = float(world_size), 1
    while factor % pre == 0 and factor / pre > pre:
        pre *= 2
    return float(pre), factor / pre, "sum"


def reduce_scatter(grads: Sequence[Sequence[np.ndarray]], reduce_dtype: type,
                   orig_dtype: type = np.float32) -> list[list[np.ndarray]]:
    """Sharded gradients [rank][param] of one fully_shard module from the local unsharded
    gradients grads[rank][param] (NOTE [ FSDP2's reduce-scatter on gloo ] 1-4)."""
    ws = len(grads)
    if ws < 1 or any(len(g) != len(grads[0]) for g in grads):
        raise ValueError("reduce_scatter: need one list of gradients per rank, all as long")
    shapes = [np.shape(g) for g in grads[0]]
    for g in grads:
        for x, shape in zip(g, shapes, strict=True):
            _check_param(np.asarray(x), "reduce_scatter")
            if np.shape(x) != shape:
                raise ValueError(f"reduce_scatter: gradient shapes differ across ranks: "
                                 f"{np.shape(x)} vs {shape}")
    dt = np.dtype(reduce_dtype).type
    pre, post, op = divide_factors(ws, reduce_dtype)  # 2.
    buffers = [copy_in(g, ws, dt) for g in grads]  # 1. one per rank, (ws * n,)
    # an inf or NaN in a local gradient reaches every rank's shard, as on the engine
    with np.errstate(over="ignore", invalid="ignore"):
        if pre is not None and pre != 1:
            buffers = [b / dt(pre) for b in buffers]
        rows = np.stack(gloo_reduce_scatter(buffers, op))  # 3. (ws, n): rank r's is row r
        if post is not None and post != 1:
            rows = rows / dt(post)
    out: list[list[np.ndarray]] = []
    for r in range(ws):
        offset, mine = 0, []
        for shape in shapes:  # 4. cut and cast
            c = padded_rows(shape[0], ws)
            n = c * int(np.prod(shape[1:], dtype=np.int64))
            block = rows[r, offset:offset + n].reshape((c, *shape[1:]))
            mine.append(unpadded(block, shape[0], r, ws).astype(orig_dtype))
            offset += n
        out.append(mine)
    return out


def gloo_reduce_scatter(buffers: Sequence[np.ndarray], op: str = "sum") -> list[np.ndarray]:
    """Each rank's output of dist.reduce_scatter_single on gloo (NOTE [ FSDP2's
    reduce-scatter on gloo ] 3): the ring all-reduce of the whole flat buffers (one per
    rank, ws * n elements), "avg" then dividing by ws in their dtype; rank r's is [r n, (r+1) n)."""
    ws = len(buffers)
    if op not in OPS:
        raise ValueError(f"gloo_reduce_scatter: op one of {OPS}, got {op!r}")
    if ws < 1 or np.asarray(buffers[0]).size % ws:
        raise ValueError("gloo_reduce_scatter: need one buffer per rank, of ws * n elements")
    flat = [np.asarray(b).reshape(-1) for b in buffers]
    total = ring_allreduce(flat)[0] if ws > 1 else flat[0].copy()
    if op == "avg":  # ReduceOp.AVG: the sum, then one division
        total = total / total.dtype.type(ws)
    return [row.copy() for row in total.reshape(ws, -1)]


def copy_in(g: Sequence[np.ndarray], ws: int, dt: type) -> np.ndarray:
    """torch._chunk_cat(g, dim=0, num_chunks=ws) into reduce_dtype: row r = each gradient's
    padded chunk r, concatenated over the parameters; the rows flattened in order."""
    return np.concatenate([shard(np.asarray(x).astype(dt), r, ws).reshape(-1)
                           for r in range(ws) for x in g])


@dataclass
class StepRecord:
    """One FSDP2 step over the simulated ranks: each unsharded parameter as every rank's
    forward used it (param_dtype, [param]), and each rank's sharded gradients [rank][param]."""

    gathered: list[np.ndarray]
    grads: list[list[np.ndarray]]


def fsdp_step(padded: Sequence[Sequence[np.ndarray]], shards: Sequence[Sequence[Any]],
              optimizers: Sequence[Any], local: Sequence[Sequence[np.ndarray]],
              groups: Sequence[Sequence[int]], *, param_dtype: type, reduce_dtype: type
              ) -> StepRecord:
    """One FSDP2 step over len(padded) simulated ranks, on the ranks' local (unsharded,
    param_dtype) gradients local[rank][param] (the forward and backward each rank runs on
    the gathered parameters are the model's, not FSDP's):
    1. all_gather: every parameter from the ranks' padded shards padded[rank][param];
    2. reduce_scatter per fully_shard module (`groups`: each module's parameter indices);
    3. each rank's optimizer steps on its shards (shards[rank]: Parameters viewing the
       unpadded rows of padded[rank], so step 1 of the next call sees the update).
    """
    ws, shapes = len(padded), [np.shape(g) for g in local[0]]
    gathered = [all_gather([padded[r][i] for r in range(ws)], shape, param_dtype)
                for i, shape in enumerate(shapes)]
    grads: list[list[Any]] = [[None] * len(shapes) for _ in range(ws)]
    for group in groups:
        rows = reduce_scatter([[local[r][i] for i in group] for r in range(ws)], reduce_dtype)
        for r in range(ws):
            for i, g in zip(group, rows[r], strict=True):
                grads[r][i] = g
    for r in range(ws):
        for p, g in zip(shards[r], grads[r], strict=True):
            p.grad = g.copy()
        optimizers[r].step()
    return StepRecord(gathered, grads)
