"""FSDP2 in both trees: one launch of gloo processes (ranks.launch running
torch_impl.fsdp's jobs) and the reference's simulated ranks (reference.fsdp) on what it
recorded.

The reference replays each run as parity/drivers/ddp.py does: the torch run's initial
parameters, sharded by reference.fsdp.shard; at every step the parameters all-gathered in
bfloat16, and, in place of a forward and backward of its own, the torch ranks' local
(unsharded, bfloat16) gradients; then the reduce-scatter and each rank's AdamW on its
shards. Beside the ranks, one unsharded AdamW per tree (reference.optim.AdamW and
torch.optim.AdamW on plain tensors) steps on the full parameters with the reduced gradients
concatenated: what a single process would hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from common.train_config import TrainConfig
from parity.compare import as_numpy, numpy_dtype
from parity.drivers.optim import FUSED, torch_sqrt
from reference import fsdp as rfsdp
from reference import optim as ropt
from reference.module import Parameter

# The MLP of the FSDP runs: rows 33, 32 and 5 chunk unevenly for ws 2 and 3 (padding, and a
# ring chunk that cuts a rank's row), 12 rows a global batch.
SIZES = (8, 33, 32, 5)
STEPS = 3
WEIGHT_DECAY = 0.01


def config(seed: int = 0) -> TrainConfig:
    """An FSDP run's configuration (fp32 master weights; the policy casts to bfloat16)."""
    return TrainConfig(seed=seed, sizes=SIZES, precision="fp32", optimizer="AdamW",
                       lr=0.01, schedule="constant", batch_size=12, num_samples=48)


def jobs(runs: tuple[tuple[int, str], ...], steps: int = STEPS) -> list[dict]:
    """One fsdp_job per (world size, reduce_dtype)."""
    from torch_impl import fsdp as tfsdp

    return [tfsdp.fsdp_job(config(), steps, w, reduce) for w, reduce in runs]


# The collective alone: sizes below and far above 2 ws MiB of buffer (where gloo's 1 MiB
# segment cap sets the ring's chunks), odd n so that ring chunks cut the ranks' rows
QUICK_REDUCE_SCATTER = (("bfloat16", 1001, "avg"), ("float32", 7, "sum"))
REDUCE_SCATTER_SIZES = (1, 7, 1001, 600_001)


def reduce_scatter_jobs(cases: tuple[tuple[str, int, str], ...], world_sizes: tuple[int, ...]
                        ) -> list[dict]:
    from torch_impl import fsdp as tfsdp

    return [tfsdp.reduce_scatter_job(dtype, n, op, seed, w) for w in world_sizes
            for seed, (dtype, n, op) in enumerate(cases)]


def reduce_scatter_case(job: dict, results: list[list[dict]], index: int
                        ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(gloo's outputs, the mirror's), one per rank of reduce_scatter job `index`."""
    ws = job["world_size"]
    inputs = [as_numpy(results[r][index]["input"]) for r in range(ws)]
    outputs = [as_numpy(results[r][index]["output"]) for r in range(ws)]
    return outputs, rfsdp.gloo_reduce_scatter(inputs, job["op"])


def launch(jobs: list[dict], world_size: int, timeout: float = 120.0) -> list[list[dict]]:
    import ranks

    return ranks.launch(jobs, world_size, timeout=timeout)


def groups(n_params: int) -> list[list[int]]:
    """The fully_shard modules' parameters: each Linear's (weight, bias); the root has none."""
    return [[i, i + 1] for i in range(0, n_params, 2)]


@dataclass
class Replay:
    """One FSDP run in both trees, [step][rank][param] unless said."""

    job: dict
    torch_gathered: list[list[list[np.ndarray]]]  # the bf16 params each Linear used
    reference_gathered: list[list[np.ndarray]]  # [step][param], the same on every rank
    torch_local: list[list[list[np.ndarray]]]  # the local unsharded bf16 gradients
    torch_grads: list[list[list[np.ndarray]]]  # the sharded float32 gradients
    reference_grads: list[list[list[np.ndarray]]]
    torch_params: list[list[list[np.ndarray]]]  # the sharded parameters after AdamW
    reference_params: list[list[list[np.ndarray]]]
    torch_state: list[list[dict[str, np.ndarray]]]  # [rank][param], after the last step
    reference_state: list[list[dict[str, np.ndarray]]]
    # [param]: (reference unsharded, torch.optim unsharded, the torch ranks' shards joined)
    unsharded_state: list[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]]
    unsharded_params: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    initial: list[np.ndarray]  # [param], the full float32 parameters
    torch_sharded: list[list[np.ndarray]]  # [rank][param], each rank's shard after fully_shard


@dataclass
class Ranks:
    """world_size simulated FSDP ranks: each one's padded shards [rank][param], its
    Parameters viewing their unpadded rows, and an AdamW on them, as the torch job's."""

    padded: list[list[np.ndarray]]
    shards: list[list[Parameter]]
    optimizers: list[ropt.AdamW]


def simulated_ranks(c: TrainConfig, world_size: int, initial: list[np.ndarray]) -> Ranks:
    """The reference's ranks sharding the torch run's `initial` full parameters."""
    ws = world_size
    padded = [[rfsdp.shard(p, r, ws) for p in initial] for r in range(ws)]  # [rank][param]
    shards = [[Parameter(rfsdp.unpadded(padded[r][i], p.shape[0], r, ws))  # views
               for i, p in enumerate(initial)] for r in range(ws)]
    optimizers = [ropt.AdamW(ps, lr=c.lr, weight_decay=WEIGHT_DECAY, fma=FUSED,
                             sqrt=torch_sqrt) for ps in shards]
    return Ranks(padded, shards, optimizers)


def _state(state: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: np.asarray(as_numpy(v) if hasattr(v, "numpy") else v) for k, v in state.items()}


def _concat(shards: list[np.ndarray]) -> np.ndarray:
    """The ranks' shards of one tensor joined along dim 0 (a 0-d entry, AdamW's step, is
    the same on every rank: rank 0's)."""
    return shards[0] if shards[0].ndim == 0 else np.concatenate(shards)


def replay(job: dict, results: list[list[dict]], index: int) -> Replay:
    """The reference's simulated ranks on run `index` of a launch (module docstring)."""
    import torch

    ws, steps = job["world_size"], job["steps"]
    c = TrainConfig(**{k: tuple(v) if k == "sizes" else v for k, v in job["config"].items()})
    reduce_dtype = numpy_dtype(job["reduce_dtype"])
    runs = [results[r][index] for r in range(ws)]
    initial = [as_numpy(p) for p in runs[0]["initial"]]
    sim = simulated_ranks(c, ws, initial)
    padded, params, optimizers = sim.padded, sim.shards, sim.optimizers
    hyper = {"lr": c.lr, "weight_decay": WEIGHT_DECAY}
    full = [Parameter(p.copy()) for p in initial]
    full_opt = ropt.AdamW(full, **hyper, fma=FUSED, sqrt=torch_sqrt)
    full_torch = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in initial]
    full_torch_opt = torch.optim.AdamW(full_torch, **hyper)
    out: dict[str, list] = {k: [] for k in ("gathered", "grads", "params")}
    for s in range(steps):
        local = [[as_numpy(g) for g in runs[r]["steps"][s]["local"]] for r in range(ws)]
        record = rfsdp.fsdp_step(padded, params, optimizers, local, groups(len(initial)),
                                 param_dtype=ml_dtypes.bfloat16, reduce_dtype=reduce_dtype)
        reduced = record.grads
        out["gathered"].append(record.gathered)
        out["grads"].append(reduced)
        out["params"].append([[p.data.copy() for p in ps] for ps in params])
        for i, (p, tp) in enumerate(zip(full, full_torch, strict=True)):
            g = np.concatenate([reduced[r][i] for r in range(ws)])
            p.grad, tp.grad = g.copy(), torch.from_numpy(g.copy())
        full_opt.step()
        full_torch_opt.step()
    return Replay(
        job=job,
        torch_gathered=[[[as_numpy(g) for g in runs[r]["steps"][s]["gathered"]]
                         for r in range(ws)] for s in range(steps)],
        reference_gathered=out["gathered"],
        torch_local=[[[as_numpy(g) for g in runs[r]["steps"][s]["local"]]
                      for r in range(ws)] for s in range(steps)],
        torch_grads=[[[as_numpy(g) for g in runs[r]["steps"][s]["grads"]] for r in range(ws)]
                     for s in range(steps)],
        reference_grads=out["grads"],
        torch_params=[[[as_numpy(p) for p in runs[r]["steps"][s]["params"]] for r in range(ws)]
                      for s in range(steps)],
        reference_params=out["params"],
        torch_state=[[_state(st) for st in runs[r]["state"]] for r in range(ws)],
        reference_state=[[_state(opt.state[p]) for p in ps]
                         for opt, ps in zip(optimizers, params, strict=True)],
        unsharded_state=[{k: (_state(full_opt.state[p])[k],
                              _state(full_torch_opt.state[tp])[k],
                              _concat([_state(runs[r]["state"][i])[k] for r in range(ws)]))
                          for k in full_opt.state[p]}
                         for i, (p, tp) in enumerate(zip(full, full_torch, strict=True))],
        unsharded_params=[(p.data.copy(), tp.detach().numpy().copy(),
                           _concat([as_numpy(runs[r]["steps"][-1]["params"][i])
                                    for r in range(ws)]))
                          for i, (p, tp) in enumerate(zip(full, full_torch, strict=True))],
        initial=initial,
        torch_sharded=[[as_numpy(p) for p in runs[r]["sharded"]] for r in range(ws)],
    )


def reduce_dtype_bound(local: list[np.ndarray]) -> np.ndarray:
    """B of claim fsdp.reduce_dtype (float64, per element of the unsharded gradient) from the
    ranks' bf16 local gradients g_r: with n = ws, u_b = 2^-8, u_f = 2^-24,
    gamma(u) = (n - 1) u / (1 - (n - 1) u) and u_d = u_b + u_f (1 + u_b) (a bf16 quotient is
    the float32 one rounded again),
        B = (sum_r |g_r| / n) (gamma(u_b) + u_d (1 + gamma(u_b))
                               + gamma(u_f) + u_f (1 + gamma(u_f))),
    widened by 2^-50 relative for its own float64 evaluation."""
    n = len(local)
    u_b, u_f = 2.0**-8, 2.0**-24
    gamma_b, gamma_f = ((n - 1) * u / (1 - (n - 1) * u) for u in (u_b, u_f))
    u_d = u_b + u_f * (1 + u_b)
    total = np.sum([np.abs(g.astype(np.float64)) for g in local], axis=0) / n
    per = (gamma_b + u_d * (1 + gamma_b)) + (gamma_f + u_f * (1 + gamma_f))
    return total * per * (1 + 2.0**-50)


def bf16_ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in bfloat16 ulps of b (float32; ulp(x) = 2^(floor(log2 |x|) - 7), the
    subnormal ulp 2^-133 below 2^-126; 0 where both are 0)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.abs(b64)))
    ulp = np.exp2(np.maximum(np.where(np.isfinite(e), e, -126.0), -126.0) - 7)
    return np.abs(a64 - b64) / ulp
