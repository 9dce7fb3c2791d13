"""Data parallel in both trees: one launch of gloo processes (ranks.launch) and the
reference's simulated ranks (reference.ddp) on what the launch recorded.

The launch's jobs: raw dist.all_reduce probes (the ring's oracle) and DDP training runs.
The reference replays each run: the same batches (data.loader), the torch run's initial
parameters, and, at every step, the torch ranks' local gradients in place of its own (the
two trees' local gradients differ in the last bits: a BLAS product's order, claim
nn.linear); what is then compared is the reducer, the ring and the optimizer, bit for bit.
The reference's own local gradients are returned too, for the figure of how far they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.train_config import TrainConfig
from common.train_loop import batches
from parity.compare import as_numpy
from parity.drivers.nn import mlp_forward_with_bound
from parity.drivers.optim import FUSED
from reference import ddp as rddp
from reference import loss_scaling as rls
from reference import optim as ropt
from reference.train_models import batch_of, build

# The MLP of the DDP runs: its 512 x 512 weight is exactly 1 MiB, so the rebuilt buckets
# close there (the first bucket's 1 MiB cap) and a run has two buckets after step 1.
SIZES = (8, 512, 512, 3)
STEPS = 3  # step 1: one bucket in parameter order; steps 2 and 3: the rebuilt buckets
# The ring probes of the default launch: sizes below, at and far above 2 ws segments
QUICK_RING = (("float32", 1), ("float32", 1000), ("float16", 7), ("bfloat16", 1000),
              ("float64", 2**18 + 3))
# The full sweep (tests/test_ddp_ring.py, slow): 3,000,017 float32 elements are 12 MB, where
# the 1 MiB segment cap sets the chunk boundaries (NOTE [ gloo's ring segments ])
RING_SIZES = (1, 7, 1000, 2**18 + 3, 3_000_017)
RING_DTYPES = ("float16", "bfloat16", "float32", "float64")


def config(precision: str, seed: int = 0) -> TrainConfig:
    """A DDP run's configuration: 12 rows a global batch (4, 6 or 3 a rank for ws 2, 3, 4)."""
    return TrainConfig(seed=seed, sizes=SIZES, precision=precision, optimizer="SGD",
                       lr=0.05, schedule="constant", batch_size=12, num_samples=48)


def train_jobs(world_sizes: tuple[int, ...], precisions: tuple[str, ...],
               gradient_as_bucket_view: bool = False, steps: int = STEPS) -> list[dict]:
    from torch_impl import ddp_jobs

    return [ddp_jobs.train_job(config(p), steps, w, gradient_as_bucket_view)
            for w in world_sizes for p in precisions]


def ring_jobs(cases: tuple[tuple[str, int], ...], world_sizes: tuple[int, ...]) -> list[dict]:
    from torch_impl import ddp_jobs

    return [ddp_jobs.allreduce_job(dtype, n, seed, w) for w in world_sizes
            for seed, (dtype, n) in enumerate(cases)]


def launch(jobs: list[dict], world_size: int, timeout: float = 120.0, backend: str = "gloo"
           ) -> list[list[dict]]:
    import ranks

    return ranks.launch(jobs, world_size, timeout=timeout, backend=backend)


def order_scale(inputs: list[np.ndarray]) -> np.ndarray:
    """S of claim ddp.order_bound: (ws - 1) sum_r |x_r| / (1 - (ws - 1) u), in float64."""
    ws = len(inputs)
    u = float(np.finfo(inputs[0].dtype).eps) / 2
    total = np.sum([np.abs(x.astype(np.float64)) for x in inputs], axis=0)
    return (ws - 1) * total / (1 - (ws - 1) * u)


def ring_case(job: dict, results: list[list[dict]], index: int
              ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """(inputs, gloo's outputs, the mirror's outputs), one each per rank of job `index`."""
    ws = job["world_size"]
    inputs = [as_numpy(results[r][index]["input"]) for r in range(ws)]
    outputs = [as_numpy(results[r][index]["output"]) for r in range(ws)]
    return inputs, outputs, rddp.ring_allreduce(inputs)


@dataclass
class Replay:
    """One DDP run in both trees: per step and rank, torch's reduced .grad and the
    reference's; the final parameters per rank; the buckets each tree used per step."""

    job: dict
    torch_initial: list[np.ndarray]  # [param]
    torch_reduced: list[list[list[np.ndarray]]]  # [step][rank][param]
    reference_reduced: list[list[np.ndarray]]  # [step][param], the same on every rank
    torch_final: list[list[np.ndarray]]  # [rank][param]
    reference_final: list[list[np.ndarray]]  # [rank][param]
    torch_buckets: list[list[list[int]]]  # [step][bucket][param index], rank 0's
    reference_buckets: list[list[list[int]]]
    torch_local: list[list[list[np.ndarray]]]  # [step][rank][param]
    reference_local: list[list[list[np.ndarray]]]  # the reference's own, [step][rank][param]
    reference_own_reduced: list[list[np.ndarray]]  # its own local gradients reduced, [step]
    torch_rows: list[list[tuple[np.ndarray, np.ndarray]]]  # [step][rank]: (x, y) it trained on
    reference_rows: list[list[tuple[np.ndarray, np.ndarray]]]
    # fp32 runs: [step][rank] (torch's output, the reference's, S of nn.mlp.forward)
    outputs: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]]


@dataclass
class Ranks:
    """world_size simulated ranks of a DDP run: a replica, an SGD and a GradScaler each, as
    torch_impl.ddp.replica builds them; the loss; the loader's global batches."""

    replicas: list
    loss_fn: Any
    optimizers: list
    scalers: list
    data: Iterator


def simulated_ranks(c: TrainConfig, world_size: int, initial: list) -> Ranks:
    """The reference's ranks of config `c`, every replica loaded with the torch run's
    `initial` parameters (the two trees draw their inits from different generators)."""
    replicas, parts = [], None
    for _ in range(world_size):
        parts = build(c, np.random.default_rng(c.seed))
        names = [name for name, _ in parts.model.named_parameters()]
        parts.model.load_state_dict(dict(zip(names, map(as_numpy, initial), strict=True)))
        replicas.append(parts.model)
    assert parts is not None
    optimizers = [ropt.SGD(m.parameters(), lr=c.lr, momentum=0.9, fma=FUSED) for m in replicas]
    scalers = [rls.make_scaler(c.precision, init_scale=c.init_scale,
                               growth_interval=c.growth_interval) for _ in range(world_size)]
    return Ranks(replicas, parts.loss_fn, optimizers, scalers, batches(c, parts.loader, batch_of))


def replay(job: dict, results: list[list[dict]], index: int) -> Replay:
    """The reference's simulated ranks on run `index` of a launch (module docstring)."""
    ws, steps = job["world_size"], job["steps"]
    c = TrainConfig(**{k: tuple(v) if k == "sizes" else v for k, v in job["config"].items()})
    runs = [results[r][index] for r in range(ws)]
    sim = simulated_ranks(c, ws, runs[0]["initial"])
    replicas, optimizers, scalers, data = sim.replicas, sim.optimizers, sim.scalers, sim.data
    torch_local = [[[as_numpy(g) for g in runs[r]["steps"][s]["local"]] for r in range(ws)]
                   for s in range(steps)]
    reduced, buckets, own, own_reduced, rows, outputs = [], [], [], [], [], []
    while len(reduced) < steps:
        x, y = next(data)
        s = len(reduced)
        if c.precision == "fp32":  # the bound of nn.mlp.forward is stated without autocast
            outputs.append([(as_numpy(runs[r]["steps"][s]["output"]),
                             *mlp_forward_with_bound(replicas[r], rddp.shard(x, r, ws), {}))
                            for r in range(ws)])
        record = rddp.ddp_step(replicas, sim.loss_fn, optimizers, scalers, x, y, step=s + 1,
                               precision=c.precision, local_grads=torch_local[s].__getitem__,
                               gradient_as_bucket_view=job["gradient_as_bucket_view"])
        reduced.append(record.reduced)
        own.append(record.own)
        own_reduced.append(rddp.reduce_gradients(record.own, record.buckets))
        rows.append(record.rows)
        buckets.append(record.buckets)
    return Replay(
        job=job,
        torch_initial=[as_numpy(p) for p in runs[0]["initial"]],
        torch_reduced=[[[as_numpy(g) for g in runs[r]["steps"][s]["reduced"]] for r in range(ws)]
                       for s in range(steps)],
        reference_reduced=reduced,
        torch_final=[[as_numpy(p) for p in runs[r]["final"]] for r in range(ws)],
        reference_final=[[p.data.copy() for p in m.parameters()] for m in replicas],
        torch_buckets=[runs[0]["steps"][s]["buckets"] for s in range(steps)],
        reference_buckets=buckets,
        torch_local=torch_local,
        reference_local=own,
        reference_own_reduced=own_reduced,
        torch_rows=[[(as_numpy(runs[r]["steps"][s]["x"]), as_numpy(runs[r]["steps"][s]["y"]))
                     for r in range(ws)] for s in range(steps)],
        reference_rows=rows,
        outputs=outputs,
    )


def own_reduced_bound(torch_local: list[np.ndarray], own_local: list[np.ndarray]
                      ) -> np.ndarray:
    """B of claim ddp.own_reduced for one parameter, from both trees' local gradients g_r,
    g'_r of every rank (float64): with c = f32(1 / ws) and u = 2^-24,
        B = c sum_r |g_r - g'_r| + (u + gamma_{ws-1} (1 + u)) c sum_r (|g_r| + |g'_r|),
    widened by 2^-50 relative for its own float64 evaluation (observed within 0.1% of B where
    the ranks' gradients cancel: the first term is then nearly attained)."""
    ws = len(torch_local)
    u = float(np.finfo(np.float32).eps) / 2
    c = float(np.float32(1.0 / ws))
    gamma = (ws - 1) * u / (1 - (ws - 1) * u)
    g = [x.astype(np.float64) for x in torch_local]
    h = [x.astype(np.float64) for x in own_local]
    diff = np.sum([np.abs(a - b) for a, b in zip(g, h, strict=True)], axis=0)
    size = np.sum([np.abs(a) + np.abs(b) for a, b in zip(g, h, strict=True)], axis=0)
    return (c * diff + (u + gamma * (1 + u)) * c * size) * (1 + 2.0**-50)
