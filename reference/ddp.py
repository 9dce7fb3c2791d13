"""Data parallel over simulated ranks: gloo's ring all-reduce in its exact summation order,
DDP's gradient buckets and its pre-division by the world size. torch_impl/ddp.py runs the
real engine (torch.distributed, gloo, DDP); this file is the same arithmetic in NumPy.

A sum over ranks is not `np.sum`. gloo's ring cuts the flat buffer into ws chunks (of whole
segments: NOTE [ gloo's ring segments ]); the partial sum of chunk k starts on rank k - 1
and travels backwards round the ring, each rank adding its own values as it passes, so
chunk k ends on rank k as ((x[k-1] + x[k-2]) + ...) + x[k] (indices mod ws) and is then
copied to every rank. Each element is one sum, in the order of the chunk it falls in
(executable: tests/test_ddp_ring.py compiles this text and holds `ring_allreduce` to it):

    def ring_element(values, k):
        ws = len(values)
        acc = values[(k - 1) % ws]
        for i in range(2, ws + 1):
            acc = acc + values[(k - i) % ws]
        return acc

Two ranks: x[1] + x[0], commutative, so any order; from three ranks on the order differs
chunk by chunk from a left-to-right sum, and so do the bits.

A DDP step (NOTE [ DDP's reducer ] for the sources): each rank's gradient is multiplied by
f32(1 / ws) (divided by ws where it already is its bucket view) as it enters its bucket, a
flat concatenation of the bucket's parameters, so the ring's chunks run across parameter
boundaries; the bucket is ring all-reduced, and the result is copied back into every rank's
.grad; the optimizer then steps on each rank alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from common.arg_ranges import WORLD_SIZES, check_int
from reference import amp
from reference.losses import Loss
from reference.nn import Module
from reference.train import _optimizer_phase

MIB = 1 << 20  # 1,048,576 bytes
MAX_SEGMENT_BYTES = MIB  # NOTE [ gloo's ring segments ]
FIRST_BUCKET_BYTES = MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
BUCKET_BYTES = 25 * MIB  # DDP's bucket_cap_mb=25

# NOTE [ gloo's ring segments ]
# gloo/allreduce.cc, ring(): torch's ProcessGroupGloo::allreduce calls gloo::allreduce,
# whose options (gloo/allreduce.h, AllreduceOptionsImpl) default to algorithm UNSPECIFIED
# (= RING) and maxSegmentSize = kMaxSegmentSize = 1 MiB. With B = elements * elementSize,
#   maxSegmentBytes = elementSize * max(1, maxSegmentSize // elementSize)
#   numSegments     = roundUp(max(ceil(B / maxSegmentBytes), 2 ws), ws)
#   segmentBytes    = roundUp(ceil(B / numSegments), elementSize)
# and chunk k is segments [k P, (k + 1) P), P = numSegments / ws, clipped to the buffer (the
# last chunks may be short or empty). Reduce-scatter: at iteration i rank r sends segment
# (r + 1) P + i (mod numSegments) to rank r - 1 and reduces the one it receives from rank
# r + 1 into its own buffer (out = out + received); after ws - 1 hops chunk k is complete on
# rank k, and the allgather copies it everywhere. The 1 MiB cap matters from 2 ws MiB on:
# below that there are exactly 2 ws segments. Checked against dist.all_reduce for world
# sizes 2-5, float16, bfloat16, float32 and float64, 1 to 3,000,017 elements (torch 2.13).
# A newer gloo source sends ring() to a shared-memory path for ranks on one node
# (is_intra_node -> shm); torch 2.13's gloo gives the ring's bits, so a torch upgrade must
# rerun the slow sweep (tests/test_ddp_ring.py) before this mirror is trusted again.


def ring_chunks(n: int, itemsize: int, world_size: int,
                max_segment_bytes: int = MAX_SEGMENT_BYTES) -> list[tuple[int, int]]:
    """The element range [lo, hi) of each rank's chunk (NOTE [ gloo's ring segments ])."""
    if world_size < 1 or n < 0 or itemsize < 1:
        raise ValueError(f"ring_chunks: need world_size >= 1, n >= 0, itemsize >= 1, got "
                         f"{world_size}, {n}, {itemsize}")
    total = n * itemsize
    max_segment = itemsize * max(1, max_segment_bytes // itemsize)
    num_segments = _round_up(max(-(-total // max_segment), 2 * world_size), world_size)
    segment = _round_up(-(-total // num_segments), itemsize) // itemsize  # elements
    per_rank = num_segments // world_size
    return [(min(k * per_rank * segment, n), min((k + 1) * per_rank * segment, n))
            for k in range(world_size)]


def ring_allreduce(arrays: Sequence[np.ndarray],
                   max_segment_bytes: int = MAX_SEGMENT_BYTES) -> list[np.ndarray]:
    """Every rank's result of gloo's ring all-reduce (sum) of `arrays` (one per rank; same
    shape and dtype): chunk k summed ((x[k-1] + x[k-2]) + ...) + x[k], in the dtype."""
    x = [np.asarray(a) for a in arrays]
    if not x or any(a.shape != x[0].shape or a.dtype != x[0].dtype for a in x):
        raise ValueError("ring_allreduce: need one array per rank, all of one shape and dtype")
    ws, flat = len(x), [a.reshape(-1) for a in x]
    out = flat[0].copy()
    if ws > 1:  # one process: gloo copies, nothing is added
        for k, (lo, hi) in enumerate(ring_chunks(out.size, out.itemsize, ws,
                                                 max_segment_bytes)):
            acc = flat[(k - 1) % ws][lo:hi].copy()
            for i in range(2, ws + 1):
                acc = acc + flat[(k - i) % ws][lo:hi]
            out[lo:hi] = acc
    return [out.reshape(x[0].shape).copy() for _ in range(ws)]


def naive_sum(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """x[0] + x[1] + ... left to right: what the ring is not, from three ranks on."""
    acc = np.asarray(arrays[0]).copy()
    for a in arrays[1:]:
        acc = acc + a
    return acc


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# NOTE [ DDP's reducer ]
# torch/nn/parallel/distributed.py and torch/csrc/distributed/c10d/reducer.cpp:
# 1. Buckets, first iteration: with find_unused_parameters=False (the default) and no static
#    graph, BucketCapacityConfig.compute_bucket_size_limits gives [sys.maxsize], so
#    _ddp_init_helper's _compute_bucket_assignment_by_size puts every parameter in ONE
#    bucket, in parameter order (reversing a list of one bucket changes nothing).
# 2. Buckets, from the second iteration: Reducer::rebuild_buckets (called from DDP's forward
#    after the first backward) re-runs compute_bucket_assignment_by_size on the parameters
#    in the order their gradients became ready (autograd_hook's push_rebuilt_params), with
#    limits [first_bucket_bytes_cap_, bucket_bytes_cap_] = [1 MiB
#    (dist._DEFAULT_FIRST_BUCKET_BYTES), 25 MiB (bucket_cap_mb)]; a bucket closes as soon as
#    its size is >= its limit (the tensor that crosses stays in it), and buckets keep the
#    ready order (no sort when tensor_indices is given). For the MLP: `ready_order`.
# 3. A bucket is one flat tensor: initialize_buckets lays its parameters out contiguously,
#    offset after offset, in the bucket's order; the all-reduce runs on the flat tensor, so
#    the ring's chunks cut across parameter boundaries.
# 4. Pre-division: mark_variable_ready_dense copies each gradient into its bucket view with
#    at::mul_out(bucket_view, grad, wrapped_scalar_tensor(1. / div_factor_)), div_factor_ =
#    world size; a CPU scalar operand enters float32 multiplication as float32, so each
#    element is f32(g * f32(1 / ws)) (for ws = 3 not g / 3). Only when a gradient already
#    aliases its bucket view (gradient_as_bucket_view=True and zero_grad(set_to_none=False):
#    from step 2 on, AccumulateGrad adds the new gradient into the zeroed view, 0 + g) does it
#    run bucket_view.div_(div_factor_), a true division: reduce_gradients(divide=True), and
#    ddp_step(gradient_as_bucket_view=True) from step 2 on.
# 5. The reduced gradient is the float32 bucket (params are float32; autocast does not change
#    a gradient's dtype), copied back into .grad (finalize_bucket_dense): exact.


def bucket_plan(sizes_bytes: Sequence[int], order: Sequence[int],
                limits: Sequence[int] = (FIRST_BUCKET_BYTES, BUCKET_BYTES)) -> list[list[int]]:
    """Parameter indices per bucket: `order` cut where a bucket's bytes reach its limit
    (the limits advance one per bucket and stay at the last). NOTE [ DDP's reducer ] 2."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for index in order:
        current.append(index)
        size += sizes_bytes[index]
        if size >= limits[min(len(buckets), len(limits) - 1)]:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def ready_order(n_params: int, precision: str) -> list[int]:
    """The order an MLP's gradients become ready in backward (NOTE [ DDP's reducer ] 2):
    params are (W0, b0, W1, b1, ...); the last layer's come first. In float32 each Linear's
    bias precedes its weight (b's AccumulateGrad hangs off AddmmBackward directly, W's
    behind TBackward); under autocast both go through a ToCopyBackward first and the
    weight's runs first (the engine's order, observed; parity/test_ddp.py holds this plan
    to the buckets DDP itself reports)."""
    if n_params % 2:
        raise ValueError(f"ready_order: an MLP has (weight, bias) pairs, got {n_params} params")
    layers = range(n_params // 2 - 1, -1, -1)
    if amp.autocast_dtype(precision) is None:
        return [i for k in layers for i in (2 * k + 1, 2 * k)]
    return [i for k in layers for i in (2 * k, 2 * k + 1)]


def step_buckets(sizes_bytes: Sequence[int], step: int, ready: Sequence[int]) -> list[list[int]]:
    """DDP's buckets at `step` (1-based): one bucket in parameter order at step 1, then
    buckets rebuilt in the `ready` order (NOTE [ DDP's reducer ] 1, 2)."""
    if step == 1:
        return bucket_plan(sizes_bytes, range(len(sizes_bytes)), (np.iinfo(np.int64).max,))
    return bucket_plan(sizes_bytes, ready)


def reduce_gradients(grads: Sequence[Sequence[np.ndarray]], buckets: Sequence[Sequence[int]],
                     divide: bool = False) -> list[np.ndarray]:
    """DDP's reduced gradients (one list, the same on every rank) of grads[rank][param]:
    pre-divided by f32(1 / ws) (`divide`: (0 + g) / ws, the in-place path of a gradient
    that is its bucket view), flattened per bucket, ring all-reduced, cut back."""
    ws = len(grads)
    reduced: list[np.ndarray | None] = [None] * len(grads[0])
    for bucket in buckets:
        flats = []
        for rank in range(ws):
            views = [grads[rank][i].reshape(-1) for i in bucket]
            dt = views[0].dtype.type
            flat = np.concatenate(views)
            if divide:  # AccumulateGrad's 0 + g into the zeroed view, then div_
                flats.append((dt(0) + flat) / dt(ws))
            else:  # at::mul_out with the reciprocal as a float32 scalar
                flats.append(flat * dt(1.0 / ws))
        total = ring_allreduce(flats)[0]
        offset = 0
        for i in bucket:
            shape = grads[0][i].shape
            reduced[i] = total[offset:offset + grads[0][i].size].reshape(shape).copy()
            offset += grads[0][i].size
    return [g for g in reduced if g is not None]


def shard(x: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank `rank`'s rows of a global batch: x[rank::ws], DistributedSampler's stride (its
    indices[rank:total:num_replicas]) applied to the batch; rows must divide evenly."""
    world_size = check_int("shard", "world_size", world_size, WORLD_SIZES)
    rank = check_int("shard", "rank", rank, range(world_size))
    if len(x) % world_size:
        raise ValueError(f"shard: a batch of {len(x)} rows does not split into {world_size} "
                         "equal shards")
    return x[rank::world_size]


@dataclass
class StepRecord:
    """One DDP step: each rank's rows (x, y), its local gradient (scaled, before the
    reduction) that was reduced, the one this tree computed (the same unless replayed), the
    reduced gradient (the same on every rank), and the buckets it was reduced in."""

    rows: list[tuple[np.ndarray, np.ndarray]]
    local: list[list[np.ndarray]]
    own: list[list[np.ndarray]]
    reduced: list[np.ndarray]
    buckets: list[list[int]]
    results: list = field(default_factory=list)  # each rank's train.StepResult


def local_backward(replicas: Sequence[Module], loss_fn: Loss, optimizers: Sequence,
                   scalers: Sequence, x: np.ndarray, y: np.ndarray, *, precision: str,
                   local_grads: Callable[[int], list[np.ndarray]] | None = None
                   ) -> tuple[list, list, list, list[float]]:
    """Each rank as reference.train.train_step up to its backward (zero_grad, autocast
    forward on shard(x, rank), float32 loss, scale(loss) backward with that rank's scaler):
    (rows, local, own, losses) per rank; `local_grads` as in ddp_step."""
    ws, dtype = len(replicas), amp.autocast_dtype(precision)
    rows, local, own, losses = [], [], [], []
    for rank, model in enumerate(replicas):
        optimizers[rank].zero_grad()
        xr, yr = shard(x, rank, ws), shard(y, rank, ws)
        rows.append((xr, yr))
        with amp.autocast(dtype):
            loss = loss_fn(model.forward(xr), yr)
        with np.errstate(over="ignore", invalid="ignore"):
            model.backward(loss_fn.backward(scalers[rank].scale(np.ones_like(loss))))
        own.append([p.grad for p in model.parameters()])
        local.append(own[-1] if local_grads is None else local_grads(rank))
        losses.append(float(loss))
    return rows, local, own, losses


def reduce_into(replicas: Sequence[Module], local: list[list[np.ndarray]], *, step: int,
                precision: str, gradient_as_bucket_view: bool = False
                ) -> tuple[list[np.ndarray], list[list[int]]]:
    """The reducer: step_buckets(step), reduce_gradients, the reduced gradient copied into
    every rank's .grad; returns (reduced, buckets). A scaled local gradient may hold inf or
    NaN: the reduction carries it to every rank (inf + x = inf, inf - inf = NaN), which is
    how every rank's scaler finds it, so NumPy's overflow and invalid warnings are silenced."""
    sizes = [g.nbytes for g in local[0]]
    buckets = step_buckets(sizes, step, ready_order(len(sizes), precision))
    with np.errstate(over="ignore", invalid="ignore"):
        reduced = reduce_gradients(local, buckets, divide=gradient_as_bucket_view and step > 1)
    for model in replicas:
        for p, g in zip(model.parameters(), reduced, strict=True):
            p.grad = g.copy()
    return reduced, buckets


def ddp_step(replicas: Sequence[Module], loss_fn: Loss, optimizers: Sequence, scalers: Sequence,
             x: np.ndarray, y: np.ndarray, *, step: int, precision: str,
             local_grads: Callable[[int], list[np.ndarray]] | None = None,
             gradient_as_bucket_view: bool = False) -> StepRecord:
    """One DDP step over len(replicas) simulated ranks; rank r trains on shard(x, r, ws).

    Each rank as reference.train.train_step up to its backward (local_backward); then the
    reducer (reduce_into: reduce_gradients over step_buckets(step)) writes the reduced
    gradient into every rank's .grad; then each rank's optimizer phase
    (train._optimizer_phase: unscale_, step unless inf/NaN, update).
    `local_grads(rank)`, if given, replaces rank's computed gradient (a replay of another
    implementation's local gradients: the reduction and the optimizer are then all that is
    compared). `gradient_as_bucket_view`: DDP's option of that name with
    zero_grad(set_to_none=False) (NOTE [ DDP's reducer ] 4).
    """
    rows, local, own, losses = local_backward(replicas, loss_fn, optimizers, scalers, x, y,
                                              precision=precision, local_grads=local_grads)
    reduced, buckets = reduce_into(replicas, local, step=step, precision=precision,
                                   gradient_as_bucket_view=gradient_as_bucket_view)
    record = StepRecord(rows, local, own, reduced, buckets)
    for rank, model in enumerate(replicas):
        with np.errstate(over="ignore", invalid="ignore"):
            record.results.append(_optimizer_phase(model, optimizers[rank], scalers[rank],
                                                   losses[rank], None, None))
    return record
