"""Loss scaling across ranks in both trees: scaler jobs in one launch of gloo processes
(torch_impl.ddp_scaler) and the reference's simulated ranks (reference.ddp_scaler) on what
the launch recorded.

Every run seeds the same fault: rank ws - 1's reduced gradient made +inf at step FAULT_STEP
(after DDP's reduction, so that rank alone sees it). The reference replays each run twice:
with the torch ranks' local gradients (as parity/drivers/ddp.py: what is then compared is
the reducer, the fault, the scalers, the found_inf all-reduce and SGD, bit for bit) and with
its own (the two trees' local gradients differ in the last bits, claim nn.linear: the
scales, skips and the check's verdict must agree all the same, the parameters need not).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.train_config import TrainConfig
from common.train_loop import batches
from parity.compare import as_numpy
from parity.drivers.optim import FUSED
from reference import ddp_scaler as rds
from reference import loss_scaling as rls
from reference import optim as ropt
from reference.train_models import batch_of, build

# A small MLP (one DDP bucket): the scaler's bookkeeping is the subject, not the buckets
SIZES = (8, 64, 64, 3)
STEPS = 6  # step 1 clean, step 2 the fault, then the ranks' different scales at work
FAULT_STEP = 2
GROWTH_INTERVAL = 2  # the clean ranks' scale grows at step 2, the faulted rank's backs off
# the torch tree's repair -> the reference's ("sharded": ShardedGradScaler's SUM)
REFERENCE_REPAIR = {"none": "none", "max": "max", "sum": "sum", "sharded": "sum"}
# The runs of the default test and of docs/distributed.md's table (world size, repair)
UNREPAIRED = ((2, "none"), (3, "none"))
REPAIRED = ((2, "max"), (3, "max"), (3, "sharded"))
# Checked by the default test but not in the table: the SUM repair by hand (the cheapest
# size), where ShardedGradScaler's own SUM would not see a torch tree that skips it
REPAIRED_UNTABLED = ((2, "sum"),)
DATA = Path(__file__).resolve().parents[2] / "docs" / "data" / "ddp_scaler.json"


def config(seed: int = 0) -> TrainConfig:
    """A scaler run: fp16 with a GradScaler per rank, 12 rows a global batch."""
    return TrainConfig(seed=seed, sizes=SIZES, precision="fp16", optimizer="SGD", lr=0.05,
                       schedule="constant", batch_size=12, num_samples=48,
                       growth_interval=GROWTH_INTERVAL)


def fault(world_size: int) -> tuple[int, int]:
    """(rank, step) of the seeded fault: the last rank, at FAULT_STEP."""
    return (world_size - 1, FAULT_STEP)


def jobs(runs: tuple[tuple[int, str], ...], check: str = "record", steps: int = STEPS,
         faults: dict[int, tuple[int, int]] | None = None) -> list[dict]:
    """One scaler job per (world size, repair), each with the seeded fault (`faults`: the
    (rank, step) per world size instead of fault(ws))."""
    from torch_impl import ddp_scaler as tds

    return [tds.scaler_job(config(), steps, w, (faults or {}).get(w, fault(w)), repair, check)
            for w, repair in runs]


def launch(job_list: list[dict], world_size: int, timeout: float = 120.0) -> list[list[dict]]:
    import ranks

    return ranks.launch(job_list, world_size, timeout=timeout)


@dataclass
class Run:
    """One tree's run of a scaler job: per step and rank what the scaler did and the check
    saw, the verdict per step, the final parameters per rank."""

    found_inf: list[list[float]]  # [step][rank], what scaler.step used
    scale: list[list[float]]  # [step][rank], the scale the step used
    skipped: list[list[bool]]  # [step][rank]
    after: list[list[float]]  # [step][rank], the scale after update
    digests: list[list[str]]  # [step][rank], rank_check.digest after the step
    divergence: list[str | None]  # [step], the cross-rank check's verdict
    final: list[list[np.ndarray]]  # [rank][param]
    spread: list[float] | None = None  # [step], max |param_r - param_0| (the reference's)

    def max_param_difference(self) -> float:
        """max over params of |param on rank r - param on rank 0|, every rank r."""
        return spread(self.final)


def spread(params: list[list[np.ndarray]]) -> float:
    """max over ranks r and parameters of |param on rank r - param on rank 0| (float64)."""
    return max((float(np.max(np.abs(a.astype(np.float64) - b)))
                for rank in params[1:] for a, b in zip(rank, params[0], strict=True)),
               default=0.0)


@dataclass
class Replay:
    job: dict
    torch: Run
    replayed: Run  # the reference on the torch ranks' local gradients
    own: Run | None  # the reference on its own local gradients (None: not run)


def torch_run(job: dict, results: list[list[dict]], index: int) -> Run:
    ws = job["world_size"]
    runs = [results[r][index] for r in range(ws)]
    steps = range(job["steps"])
    states = [runs[0]["steps"][s]["states"] for s in steps]  # gathered: the same on every rank
    for r in range(1, ws):
        assert [runs[r]["steps"][s]["states"] for s in steps] == states, "gathered alike"
    return Run(
        found_inf=[[runs[r]["steps"][s]["found_inf"] for r in range(ws)] for s in steps],
        scale=[[runs[r]["steps"][s]["scale"] for r in range(ws)] for s in steps],
        skipped=[[runs[r]["steps"][s]["skipped"] for r in range(ws)] for s in steps],
        after=[[st["scale"] for st in states[s]] for s in steps],
        digests=[[st["digest"] for st in states[s]] for s in steps],
        divergence=[runs[0]["steps"][s]["divergence"] for s in steps],
        final=[[as_numpy(p) for p in runs[r]["final"]] for r in range(ws)],
    )


def reference_run(job: dict, initial: list[np.ndarray],
                  local: list[list[list[np.ndarray]]] | None) -> Run:
    """The reference's simulated ranks from the torch run's `initial` parameters; `local`
    [step][rank][param]: the local gradients to replay (None: its own)."""
    ws, steps = job["world_size"], job["steps"]
    c = TrainConfig(**{k: tuple(v) if k == "sizes" else v for k, v in job["config"].items()})
    replicas, parts = [], None
    for _ in range(ws):
        parts = build(c, np.random.default_rng(c.seed))
        names = [name for name, _ in parts.model.named_parameters()]
        parts.model.load_state_dict(dict(zip(names, initial, strict=True)))
        replicas.append(parts.model)
    assert parts is not None
    optimizers = [ropt.SGD(m.parameters(), lr=c.lr, momentum=0.9, fma=FUSED) for m in replicas]
    scalers = [rls.make_scaler(c.precision, init_scale=c.init_scale,
                               growth_interval=c.growth_interval) for _ in range(ws)]
    records, spreads = [], []
    data = batches(c, parts.loader, batch_of)
    while len(records) < steps:
        x, y = next(data)
        s = len(records)
        records.append(rds.scaler_step(
            replicas, parts.loss_fn, optimizers, scalers, x, y, step=s + 1,
            precision=c.precision,
            fault=None if job["fault"] is None else tuple(job["fault"]),
            repair=REFERENCE_REPAIR[job["repair"]],
            local_grads=None if local is None else local[s].__getitem__))
        spreads.append(spread([[p.data for p in m.parameters()] for m in replicas]))
    return Run(
        found_inf=[r.found_inf for r in records], scale=[r.scale for r in records],
        skipped=[r.skipped for r in records],
        after=[[st.scale for st in r.states] for r in records],
        digests=[[st.digest for st in r.states] for r in records],
        divergence=[r.divergence for r in records],
        final=[[p.data.copy() for p in m.parameters()] for m in replicas],
        spread=spreads,
    )


def replay(job: dict, results: list[list[dict]], index: int, own: bool = True) -> Replay:
    """Run `index` of a launch in the torch tree and the reference, replayed and (`own`) on
    its own local gradients."""
    ws = job["world_size"]
    initial = [as_numpy(p) for p in results[0][index]["initial"]]
    local = [[[as_numpy(g) for g in results[r][index]["steps"][s]["local"]] for r in range(ws)]
             for s in range(job["steps"])]
    return Replay(job, torch_run(job, results, index), reference_run(job, initial, local),
                  reference_run(job, initial, None) if own else None)


def figures(replays: dict[tuple[int, str], Replay]) -> dict[str, Any]:
    """docs/distributed.md's table: per run and step, each rank's scale after update,
    the ranks that skipped, max |param_r - param_0| over ranks (the reference replaying the
    torch ranks' local gradients: the torch ranks' own bits, claims ddp.scaler_*), and the
    cross-rank check's verdict."""
    runs = []
    order = {key: i for i, key in enumerate(UNREPAIRED + REPAIRED)}
    tabled = [kv for kv in replays.items() if kv[0] not in REPAIRED_UNTABLED]
    for (ws, repair), rp in sorted(tabled, key=lambda kv: order.get(kv[0], len(order))):
        t = rp.torch
        assert rp.replayed.spread is not None
        runs.append({"world_size": ws, "repair": repair, "fault": list(rp.job["fault"]),
                     "steps": [{"scale": t.after[s],
                                "skipped": [r for r, k in enumerate(t.skipped[s]) if k],
                                "max_abs_param_difference": rp.replayed.spread[s],
                                "divergence": t.divergence[s]} for s in range(len(t.after))],
                     "final_max_abs_param_difference": t.max_param_difference()})
    return {"sizes": list(SIZES), "steps": STEPS, "growth_interval": GROWTH_INTERVAL,
            "runs": runs}


def measure() -> dict[tuple[int, str], Replay]:
    """The default runs (UNREPAIRED, and REPAIRED and REPAIRED_UNTABLED with the check set
    to raise), one launch; the reference's own local gradients on the unrepaired runs (where
    its own parting is the point; the slow matrix runs it on all)."""
    job_list = jobs(UNREPAIRED) + jobs(REPAIRED + REPAIRED_UNTABLED, check="raise")
    results = launch(job_list, 3)
    return {(j["world_size"], j["repair"]): replay(j, results, i, own=j["repair"] == "none")
            for i, j in enumerate(job_list)}


def write_figures(path: Path = DATA) -> dict[str, Any]:
    """Measure the default runs and write their figures (docs/distributed.md's table)."""
    import torch

    data = {"torch": torch.__version__, **figures(measure())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return data


if __name__ == "__main__":
    print(json.dumps(write_figures(), indent=1))
