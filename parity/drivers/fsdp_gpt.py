"""The GPT with AdamW under FSDP2 in both trees: one launch of gloo processes (torch_impl's
fsdp_gpt.gpt_job, the real engine) and the reference's simulated ranks
(reference/fsdp_gpt.py's fsdp_step) replaying what the launch recorded, as
parity/drivers/fsdp.py does for the MLP: the torch run's initial parameters sharded, the
same batches and, at every step, the torch ranks' local (unsharded, param_dtype) gradients
in place of the reference's own. What is then compared is the all-gather, the
reduce-scatter per fully_shard module, AdamW on each rank's rows and the schedule.

Also the learning control: the FSDP2 run's losses against torch's single-process run on the
same global batches (parity/drivers/ddp_gpt.py's one_process_losses).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from common.train_config import TrainConfig
from common.train_loop import batches
from parity.compare import as_numpy
from parity.drivers.optim import FUSED, torch_sqrt
from reference import ddp_gpt as rgpt
from reference import fsdp_gpt as rfsdp_gpt
from reference.train_models import batch_of

STEPS = 3
BATCH = 12  # rows of the global batch: 6 or 4 a rank at 2 or 3 ranks
# fp16's scaler: from 2^18 (float16's backward overflows from about 2^19 on the seed's
# batches), growing every 2 clean steps: at 2 ranks steps 1 and 2 step and grow the scale,
# step 3 overflows on both ranks' rows, step 4 on rank 0's alone (the all-reduce's case)
FP16_SCALER = {"init_scale": 2.0**18, "growth_interval": 2}
FP16_STEPS = 4
# What `train --world-size N --model gpt --parallel fsdp` builds from RESUME_OPTIONS and
# --steps 4: the stopped and resumed run of the default test (dropout on: every rank's
# stream is restored too)
RESUME_OPTIONS = ("--model", "gpt", "--parallel", "fsdp", "--precision", "bf16",
                  "--dropout", "0.1", "--horizon", "4", "--checkpoint-every", "2")
RESUME = TrainConfig(model="gpt", precision="bf16", dropout=0.1, optimizer="AdamW",
                     schedule="cosine", horizon=4, batch_size=24)
# the same run in fp16 (RESUME_FP16_OPTIONS): its step-2 commit holds growth tracker 2, and
# the scale grows at step 3
RECOMPUTE = "uniform:2+selective"  # what the stopped and resumed runs of the tests recompute
RESUME_FP16_OPTIONS = (*RESUME_OPTIONS[:5], "fp16", *RESUME_OPTIONS[6:], "--init-scale",
                       "262144", "--growth-interval", "3")
RESUME_FP16 = TrainConfig(model="gpt", precision="fp16", dropout=0.1, optimizer="AdamW",
                          schedule="cosine", horizon=4, batch_size=24, init_scale=2.0**18,
                          growth_interval=3)


def config(precision: str, steps: int = STEPS, seed: int = 0) -> TrainConfig:
    """An FSDP2 GPT run's configuration: AdamW, cosine over the run's steps, BATCH rows;
    fp16's scaler FP16_SCALER."""
    return TrainConfig(seed=seed, model="gpt", precision=precision, optimizer="AdamW",
                       schedule="cosine", horizon=steps, batch_size=BATCH, num_samples=48,
                       **(FP16_SCALER if precision == "fp16" else {}))


def gpt_jobs(world_size: int, precisions: tuple[str, ...], steps: int | None = None
             ) -> list[dict]:
    """One recorded job a precision, `steps` steps (default: STEPS, fp16 FP16_STEPS)."""
    from torch_impl import fsdp_gpt

    jobs = []
    for p in precisions:
        n = steps or (FP16_STEPS if p == "fp16" else STEPS)
        jobs.append(fsdp_gpt.gpt_job(config(p, n), n, world_size))
    return jobs


def scaled_config(precision: str) -> TrainConfig:
    """What `train --world-size N --model gpt --parallel fsdp --precision P --horizon 4`
    builds (the scaled resume's run: no scaler, no dropout)."""
    return TrainConfig(model="gpt", precision=precision, optimizer="AdamW", schedule="cosine",
                       horizon=4, batch_size=24)


def resume_jobs(directory: Path, world_size: int, steps: int = 4, stop: int = 2,
                config: TrainConfig = RESUME, recompute: str = "none",
                loader_workers: int = 0) -> list[dict]:
    """Three runs of the command's job (torch_impl/fsdp_gpt.py's train_job) of `config`
    (RESUME, RESUME_FP16), to be launched in a row, committing every `stop` steps: to `steps`
    uninterrupted, to `stop`, then resumed from that commit to `steps`, these two with
    `recompute` and `loader_workers` (the uninterrupted run: none, 0); in folders named
    after the precision."""
    from torch_impl.fsdp_gpt import train_job

    other = replace(config, recompute=recompute)
    jobs = []
    for name, until, resume, c, workers in (
            ("uninterrupted", steps, None, config, 0),
            ("stopped", stop, None, other, loader_workers),
            ("stopped", steps, stop, other, loader_workers)):
        folder = directory / config.precision / name
        folder.mkdir(parents=True, exist_ok=True)
        jobs.append(train_job(c, until, world_size, folder, stop, keep=2, resume=resume,
                              log=directory / config.precision / f"{name}.log",
                              loader_workers=workers))
    return jobs


@dataclass
class Replay:
    """The reference's simulated ranks replaying a torch fsdp-gpt job: per step the gathered
    parameters [param], the sharded gradients [rank][param], each rank's rows after AdamW
    [rank][param], the lr it stepped with and each rank's scaler [rank] (the scale the step
    used, found_inf, skipped, the growth tracker and scale after update); at the end each
    rank's AdamW and schedule state (reference.ddp_gpt.optimizer_state's keys), its model
    buffers (fp8-delayed's histories and scales) and its BitStream's state (nvfp4)."""

    gathered: list[list[np.ndarray]] = field(default_factory=list)
    grads: list[list[list[np.ndarray]]] = field(default_factory=list)
    params: list[list[list[np.ndarray]]] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    scaler: list[list[dict[str, Any]]] = field(default_factory=list)
    optimizer: list[dict[str, Any]] = field(default_factory=list)
    buffers: list[dict[str, np.ndarray]] = field(default_factory=list)
    bits: list[dict[str, Any] | None] = field(default_factory=list)


def replay(job: dict, results: list[list[dict]], index: int) -> Replay:
    """The reference's ranks on job `index` of a launch (results[rank][index]): the torch
    run's initial parameters, its batches, its local gradients; AdamW with torch's CPU sqrt
    and fused multiply-adds (NOTE [ torch's CPU sqrt is MKL's ], NOTE [ FMA in torch's CPU
    kernels ]) and the same schedule; fp8-delayed: the torch ranks' amax vectors too; nvfp4:
    each rank's own bits (common.ddp_bits.rank_bits)."""
    c = TrainConfig(**{k: tuple(v) if k == "sizes" else v for k, v in job["config"].items()})
    ws = job["world_size"]
    initial = [as_numpy(t) for t in results[0][index]["initial"]]
    ranks = rfsdp_gpt.simulated_ranks(c, ws, initial, fma=FUSED, sqrt=torch_sqrt)
    out = Replay()
    data = batches(c, ranks.parts.loader, batch_of)
    for k in range(job["steps"]):
        x, y = next(data)
        out.lrs.append(ranks.optimizers[0].param_groups[0]["lr"])

        def local(rank: int, k: int = k) -> list[np.ndarray]:
            return [as_numpy(g) for g in results[rank][index]["steps"][k]["local"]]

        def amax(rank: int, k: int = k) -> np.ndarray:
            return as_numpy(results[rank][index]["steps"][k]["amax"])

        record = rfsdp_gpt.fsdp_step(ranks, x, y, precision=c.precision, local_grads=local,
                                     local_amax=amax)
        for scheduler, skipped in zip(ranks.schedulers, record.skipped, strict=True):
            if not skipped:  # the schedule counts applied updates
                scheduler.step()
        out.scaler.append([{"scale": record.scale[r], "found_inf": record.found_inf[r],
                            "skipped": record.skipped[r],
                            "tracker": ranks.scalers[r]._get_growth_tracker(),
                            "next_scale": ranks.scalers[r].get_scale()} for r in range(ws)])
        out.gathered.append(record.gathered)
        out.grads.append(record.grads)
        out.params.append([[p.data.copy() for p in ps] for ps in ranks.shards])
    for opt, scheduler, ps in zip(ranks.optimizers, ranks.schedulers, ranks.shards,
                                  strict=True):
        out.optimizer.append(rgpt.optimizer_state(opt, scheduler, ps))
    out.buffers = [{n: b.copy() for n, b in m.named_buffers()} for m in ranks.replicas]
    out.bits = [None if b is None else b.state() for b in ranks.bits]
    return out


def fsdp_losses(results: list[list[dict]], index: int) -> list[float]:
    """The global batch's loss at every step of a torch fsdp-gpt job: the mean of the
    ranks' shard losses, in float64 (what the command prints)."""
    ws = len(results)
    steps = len(results[0][index]["steps"])
    return [sum(float(results[r][index]["steps"][k]["loss"]) for r in range(ws)) / ws
            for k in range(steps)]
