"""`python -m parity train --world-size N`: the MLP or the GPT trained data-parallel over N
ranks, with a sharded checkpoint every K steps and resume from the newest commit. This tree
runs the N ranks simulated in one process (reference/ddp.py's ddp_step) and saves them with
reference/sharded_ckpt.py; torch_impl/ddp_train.py runs the same run in N gloo processes
under DistributedDataParallel, saved with DCP.

The run (both trees):

    config: model "mlp" with optimizer "SGD" (momentum 0.9) at a constant lr, or model
            "gpt" with "AdamW" (weight decay 0.01) under the schedule of the single-process
            run (--schedule: cosine, step or constant over the horizon, stepped after every
            step that is not skipped; its recomputation too); a global batch of batch_size
            rows of which rank r trains on rows r::N (reference.ddp.shard); precision
            fp32 | bf16 | fp16 (autocast; fp16 with a GradScaler per rank: the ranks agree
            on every skip, since DDP's all-reduce carries an inf or NaN of any rank's local
            gradient to every rank's .grad), or, for the GPT, a scaled precision of
            common/fp8_train.py (the blocks' GEMMs scaled per rank from its own shard;
            fp8-delayed's amaxes reduced with MAX before the scale update: NOTE [ Delayed
            scaling on N ranks ] in reference/ddp_gpt.py) or bf16-sr (BF16SR on the reduced
            gradient); nvfp4's and bf16-sr's bits by NOTE [ Random bits on N ranks ]
            (common/ddp_bits.py): bf16-sr's one stream shared by every rank, nvfp4's one a
            rank
    init:   every rank's weights from the seed (the same), then rank r's dropout stream
            seeded rank_seed(seed, r, 0) (ckpt/commit.py), and its bits (rank_bits)
    step:   ddp_step (reference/ddp_gpt.py's for the GPT): each rank's local backward on
            its rows, DDP's reducer (buckets in parameter order at the run's step 1,
            rebuilt in the ready order after it; NOTE [ DDP's buckets after a resume ] in
            torch_impl/ddp_train.py), each rank's
            optimizer phase (unscale, step unless inf/NaN, update), then the schedule
    save:   at every K-th step and the last, every rank's state (the table in
            torch_impl/sharded_ckpt.py, the GPT's AdamW and schedule rows included, plus
            "skipped", and the bits' state: "bits" shared, "bits/rank<r>" per rank) and
            config.json, then the commit record; the newest --keep commits
            are kept (ckpt.commit_policy.prune). --async-save: the same files and record,
            staged and written in the background (NOTE [ An async save commits after its
            data is durable ] in reference/async_ckpt.py)
    resume: from the newest verified commit: at the same N every rank's own state, at
            another N rank 0's replicated entries (bf16-sr's shared bits among them) with
            every per-rank stream (dropout's, nvfp4's bits) re-derived from
            rank_seed(seed, rank, step) (NOTE [ Resharding a DDP checkpoint ])
    digest: common.state_digest.sharded_state_digest of rank 0's final state (the GPT's:
            common.ddp_gpt_state.gpt_rank_digest, AdamW's buffers in the momentum's place);
            every rank's must be the same (DDP keeps the replicas equal), else the run fails

What is exact: a run killed at any moment and resumed at the same N ends with the
uninterrupted run's digest (every entry a step reads is saved; the buckets after a resume
are the uninterrupted run's). A resume at another N continues from the saved state, but
its steps are an N' run's (a mean over N' shards rounds otherwise), so its digest is not
the N run's. The two trees' digests differ, as the single-process runs' do: their local
gradients differ in the last bits (claims nn.linear, ddp.own_reduced); what the claims hold
bit-equal across the trees (ddp.params) replays the torch ranks' local gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ckpt import commit_policy
from ckpt.policy import due
from common.ddp_bits import bits_key, rank_bits, shared
from common.ddp_gpt_state import gpt_rank_digest
from common.fp8_train import WEIGHT_PRECISIONS, autocast_precision
from common.recipes_train import BitStream
from common.state_digest import sharded_state_digest
from common.train_config import OPTIMIZERS, TrainConfig
from common.train_loop import RanksResult, batches
from reference import ddp as rddp
from reference import ddp_gpt, loss_scaling, optim
from reference import sharded_ckpt as sharded
from reference.async_ckpt import AsyncSaver, save_step
from reference.nn import Module
from reference.recipes_train import BF16SR
from reference.state_digest import as_array
from reference.train import _make_scheduler
from reference.train_models import batch_of, build

PAYLOAD = sharded.PAYLOAD


@dataclass
class Rank:
    """One simulated rank: its model, optimizer, scaler, random stream and (the GPT's)
    schedule and bits (nvfp4, bf16-sr)."""

    model: Module
    optimizer: optim.Optimizer
    scaler: loss_scaling.GradScaler
    rng: np.random.Generator
    scheduler: Any = None
    bits: BitStream | None = None
    precision: str = "fp32"


def _rank(c: TrainConfig, rank: int) -> tuple[Rank, Any]:
    """Rank `rank` of a run of `c` and its parts (build's: the loader of the global batch)."""
    rng = np.random.default_rng(c.seed)  # the weights: the same on every rank
    bits = rank_bits(c.seed, c.precision, rank)  # NOTE [ Random bits on N ranks ]
    parts = build(c, rng, bits)
    rng.bit_generator.state = sharded.rank_stream(c.seed, rank, 0)  # its dropout stream
    if c.precision in WEIGHT_PRECISIONS:  # bf16 weights, AdamWSR on the shared bits
        opt: Any = BF16SR(parts.model.parameters(), bits, lr=c.lr, **OPTIMIZERS[c.optimizer])
    else:
        opt = getattr(optim, c.optimizer)(parts.model.parameters(), lr=c.lr,
                                          **OPTIMIZERS[c.optimizer])
    scaler = loss_scaling.make_scaler(autocast_precision(c.precision), init_scale=c.init_scale,
                                      growth_interval=c.growth_interval)
    scheduler = _make_scheduler(opt, c) if c.model == "gpt" else None
    return Rank(parts.model, opt, scaler, rng, scheduler, bits, c.precision), parts


def rank_state(r: Rank, sampler: Any, step: int, skipped: int, rank: int) -> dict[str, Any]:
    """Rank `rank`'s saved state: torch_impl/sharded_ckpt.py's table, plus "skipped"."""
    state: dict[str, Any] = {f"model/{k}": v for k, v in r.model.state_dict().items()}
    if r.scheduler is not None:  # the GPT: AdamW and its schedule
        state.update(ddp_gpt.optimizer_state(r.optimizer, r.scheduler, r.model.parameters()))
    for i, p in enumerate(r.model.parameters() if r.scheduler is None else ()):
        buf = r.optimizer.state.get(p, {}).get("momentum_buffer")
        state[f"optim/momentum/{i}"] = np.zeros_like(p.data) if buf is None else buf.copy()
    state["scaler/scale"] = np.float64(r.scaler.get_scale())
    state["scaler/growth_tracker"] = np.int64(r.scaler._get_growth_tracker())
    state["data/epoch"] = np.int64(sampler.epoch)
    state["data/position"] = np.int64(sampler.position)
    state["step"] = np.int64(step)
    state["skipped"] = np.int64(skipped)
    state[f"rng/rank{rank}"] = r.rng.bit_generator.state
    if r.bits is not None:
        state[bits_key(r.precision, rank)] = r.bits.state()
    return state


def _apply(state: dict[str, Any], r: Rank, rank: int, c: TrainConfig, resharded: bool) -> None:
    """Rank `rank`'s objects set from its loaded state (the data position: _run's sampler);
    `resharded` (another world size saved it): a per-rank bit stream is re-derived, not read
    (NOTE [ Random bits on N ranks ])."""
    r.model.load_state_dict({k.removeprefix("model/"): v for k, v in state.items()
                             if k.startswith("model/")})
    if r.scheduler is not None:
        ddp_gpt.load_optimizer_state(state, r.optimizer, r.scheduler, r.model.parameters())
    for i, p in enumerate(r.model.parameters() if r.scheduler is None else ()):
        r.optimizer.state[p] = {"momentum_buffer": np.array(state[f"optim/momentum/{i}"])}
    sd = r.scaler.state_dict()
    if sd:
        sd.update(scale=float(state["scaler/scale"]),
                  _growth_tracker=int(state["scaler/growth_tracker"]))
        r.scaler.load_state_dict(sd)
    r.rng.bit_generator.state = state[f"rng/rank{rank}"]
    if r.bits is not None and resharded and not shared(c.precision):
        r.bits.load(rank_bits(c.seed, c.precision, rank, int(state["step"])).state())
    elif r.bits is not None:
        r.bits.load(state[bits_key(c.precision, rank)])


def train(config: TrainConfig, steps: int, world_size: int, directory: str | Path,
          every: int, *, keep: int, start: commit_policy.Start,
          log: Callable[[str], None], async_save: str | None = None) -> RanksResult:
    """Run the N-rank training (the module docstring) from `start` (ckpt.commit_policy's
    decision, taken before) to `steps`. `async_save` ("copy"): the checkpoints saved by a
    background thread (reference/async_ckpt.py)."""
    c, ws = config, world_size
    ranks, parts = zip(*(_rank(c, r) for r in range(ws)), strict=True)
    sampler, loader, loss_fn = parts[0].sampler, parts[0].loader, parts[0].loss_fn
    step = skipped = 0
    if start.record is not None:
        record, states = sharded.load_sharded(directory, ws, c.seed)
        if record.step != start.record.step:
            raise RuntimeError(f"{directory}: its newest commit is step {record.step}, the "
                               f"command chose step {start.record.step} (changed since?)")
        for rank, (r, state) in enumerate(zip(ranks, states, strict=True)):
            _apply(state, r, rank, c, record.world_size != ws)
        sampler.load_state_dict({**sampler.state_dict(), "epoch": int(states[0]["data/epoch"]),
                                 "position": int(states[0]["data/position"])})
        step, skipped = int(states[0]["step"]), int(states[0]["skipped"])
    data = batches(c, loader, batch_of)  # from the sampler's (restored) position
    models = [r.model for r in ranks]
    saver = None if async_save is None else AsyncSaver()
    while step < steps:
        x, y = next(data)
        optimizers, scalers = [r.optimizer for r in ranks], [r.scaler for r in ranks]
        if c.model == "gpt":
            record = ddp_gpt.ddp_step(models, optimizers, scalers, x, y,
                                      step=min(step + 1, 2), precision=c.precision)
        else:
            record = rddp.ddp_step(models, loss_fn, optimizers, scalers, x, y,
                                   step=min(step + 1, 2), precision=c.precision)
        skip = record.results[0].skipped
        for r, result in zip(ranks, record.results, strict=True):
            if r.scheduler is not None and not result.skipped:  # it counts applied updates
                r.scheduler.step()
        step, skipped = step + 1, skipped + int(skip)
        mean = sum(np.float64(res.loss) for res in record.results) / ws
        log(f"step {step} loss {float(mean):.6g} scale {record.results[0].scale:g} "
            f"skipped {int(skip)} (total {skipped})")
        if due(step, steps, every):  # with a saver: staged, written meanwhile
            save_step(directory, step, [rank_state(r, sampler, step, skipped, i)
                                        for i, r in enumerate(ranks)], saver=saver,
                      config=c.to_dict(), keep=keep)
    if saver is not None:
        saver.close()  # the last save committed (or its error raised) before the digest
    digest = gpt_rank_digest if c.model == "gpt" else sharded_state_digest
    digests = [digest(rank_state(r, sampler, step, skipped, i), as_array)
               for i, r in enumerate(ranks)]
    if len(set(digests)) != 1:
        raise RuntimeError(f"ddp: the ranks end in different states: digests {digests}")
    return RanksResult(step, digests[0], skipped)
