"""The checkpoint of the GPT's FSDP2 run on one torch rank (torch_impl/fsdp_gpt.py): the
rank's state through torch.distributed.checkpoint.state_dict, putting a loaded one back, the
full state the digest reads, and the load of a commit at any world size. See
reference/fsdp_gpt_ckpt.py for the table's sharded and replicated entries and NOTE
[ Resharding an FSDP checkpoint ]. (`rep` below is torch_impl.fsdp_gpt.Replica, typed Any:
that module imports this one.)

What the engine does that the reference states:
- get_state_dict (sharded) gives every model entry and AdamW's exp_avg and exp_avg_sq as a
  DTensor on Shard(0): to_local() is this rank's unpadded rows (FSDP2 keeps the padding
  inside its own storage, never in a state dict); AdamW's step is a plain 0-d tensor.
- dcp.save writes each rank's rows with their global offsets; dcp.load into DTensors of
  another world size reads, for every rank, the parts of the saved chunks that overlap its
  own rows (DefaultLoadPlanner over the ChunkStorageMetadata): the reference's join and cut,
  done by the planner. set_state_dict then puts the rows into the sharded parameters and
  AdamW's state.
- The model's buffers (fp8-delayed's histories and scales) are plain tensors in
  get_state_dict's model entries (fully_shard shards parameters only): replicated entries,
  the same on every rank, which DCP writes once and loads at any world size; nvfp4's bits
  are the rank's (bits/rank<r>: torch_impl.ddp_gpt.bits_state), left out of the template
  and re-derived at another world size (NOTE [ Random bits on N ranks ]).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from ckpt import commit as ckc
from common.ddp_bits import bits_key, rank_bits, shared
from torch_impl import ddp_gpt
from torch_impl import sharded_ckpt as sc

ADAMW_ENTRIES = ("step", "exp_avg", "exp_avg_sq")


def rank_state(rep: Any, generator: torch.Generator, step: int, rank: int,
               full: bool = False, skipped: int = 0) -> dict[str, torch.Tensor]:
    """This rank's state, the table of torch_impl/sharded_ckpt.py: model/<name>,
    optim/step|exp_avg|exp_avg_sq/<i>, optim/lr, sched/..., scaler/scale and
    scaler/growth_tracker (bf16 and fp32: 1 and 0, the disabled scaler's), data/..., step,
    skipped, rng/rank<r>. From get_state_dict: sharded DTensors (aliasing
    the live ones: a template for load_sharded fills them), or with `full` every entry
    all-gathered (every rank then holds the same full tensors: the digest's). Before the
    first step, get_state_dict creates AdamW's state by a step at lr 0 on zero gradients
    (step 1, zero moments): only a template, which the load overwrites."""
    options = StateDictOptions(full_state_dict=full)
    model_sd, optim_sd = get_state_dict(rep.parts.model, rep.optimizer, options=options)
    state: dict[str, torch.Tensor] = {f"model/{k}": v for k, v in model_sd.items()}
    index = {n: i for i, n in enumerate(rep.names)}
    for name, entries in optim_sd["state"].items():
        for key in ADAMW_ENTRIES:
            state[f"optim/{key}/{index[name]}"] = entries[key]
    state["optim/lr"] = torch.tensor(rep.optimizer.param_groups[0]["lr"], dtype=torch.float64)
    state["sched/last_epoch"] = torch.tensor(rep.scheduler.last_epoch, dtype=torch.int64)
    state["sched/step_count"] = torch.tensor(rep.scheduler._step_count, dtype=torch.int64)
    state["scaler/scale"] = torch.tensor(rep.scaler.get_scale(), dtype=torch.float64)
    state["scaler/growth_tracker"] = torch.tensor(rep.scaler._get_growth_tracker(),
                                                  dtype=torch.int64)
    sampler = rep.parts.sampler
    state["data/epoch"] = torch.tensor(sampler.epoch, dtype=torch.int64)
    state["data/position"] = torch.tensor(sampler.position, dtype=torch.int64)
    state["step"] = torch.tensor(step, dtype=torch.int64)
    state["skipped"] = torch.tensor(skipped, dtype=torch.int64)
    state[f"rng/rank{rank}"] = generator.get_state()
    if rep.bits is not None:
        state.update(ddp_gpt.bits_state(rep, rank))
    return state


def apply_loaded(state: dict[str, torch.Tensor], rep: Any, generator: torch.Generator,
                 rank: int) -> int:
    """set_state_dict from a loaded rank_state (model and AdamW: this rank's rows), then the
    lr, the schedule, the scaler, the sampler and the stream (if loaded: load_ranks leaves
    it out at another world size); returns the step."""
    model_sd = {k.removeprefix("model/"): v for k, v in state.items() if k.startswith("model/")}
    lr = float(state["optim/lr"])
    _, optim_sd = get_state_dict(rep.parts.model, rep.optimizer)
    for name in optim_sd["state"]:
        i = rep.names.index(name)
        optim_sd["state"][name] = {k: state[f"optim/{k}/{i}"] for k in ADAMW_ENTRIES}
    for g in optim_sd["param_groups"]:
        g["lr"] = lr
    set_state_dict(rep.parts.model, rep.optimizer, model_state_dict=model_sd,
                   optim_state_dict=optim_sd)
    sd = rep.scheduler.state_dict()
    sd.update(last_epoch=int(state["sched/last_epoch"]),
              _step_count=int(state["sched/step_count"]), _last_lr=[lr])
    rep.scheduler.load_state_dict(sd)
    sd = rep.scaler.state_dict()
    if sd:  # fp16's; a disabled scaler has no state
        sd.update(scale=float(state["scaler/scale"]),
                  _growth_tracker=int(state["scaler/growth_tracker"]))
        rep.scaler.load_state_dict(sd)
    rep.parts.sampler.load_state_dict({**rep.parts.sampler.state_dict(),
                                       "epoch": int(state["data/epoch"]),
                                       "position": int(state["data/position"])})
    if f"rng/rank{rank}" in state:
        generator.set_state(state[f"rng/rank{rank}"])
    c, key = rep.config, bits_key(rep.config.precision, rank)
    if rep.bits is not None:  # the saved bits, else (another world size) re-derived
        rep.bits.load(ddp_gpt.bits_dict(state[key]) if key in state else
                      rank_bits(c.seed, c.precision, rank, int(state["step"])).state())
    return int(state["step"])


def digest_state(rep: Any, generator: torch.Generator, step: int, rank: int
                 ) -> dict[str, torch.Tensor]:
    """The full state (every rank's rows joined; the scaler's entries as the DDP run's),
    for common.ddp_gpt_state.gpt_rank_digest."""
    return rank_state(rep, generator, step, rank, full=True)


def load_ranks(parent: str | os.PathLike, rep: Any, generator: torch.Generator,
               rank: int, world_size: int, group: Any) -> tuple[ckc.Commit, int, int]:
    """This rank set from the newest verified commit, whatever world size saved it (NOTE
    [ Resharding an FSDP checkpoint ] in reference/fsdp_gpt_ckpt.py): DCP loads its rows
    at `world_size` and the replicated entries; the stream is its own at the same world
    size, else re-derived. Returns the commit, its step and its skipped count."""
    template = rank_state(rep, generator, 0, rank)
    record, _ = ckc.newest(parent, sc.PAYLOAD)
    if record.world_size != world_size:  # NOTE [ Resharding a DDP checkpoint ]: re-derived
        del template[f"rng/rank{rank}"]
        if not shared(rep.config.precision):
            template.pop(bits_key(rep.config.precision, rank), None)
    commit, _ = sc.load_sharded(parent, template, group)
    if commit.path != record.path:
        raise RuntimeError(f"{parent}: its newest commit changed while loading")
    step = apply_loaded(template, rep, generator, rank)
    if commit.world_size != world_size:
        generator.manual_seed(ckc.rank_seed(rep.config.seed, rank, step))
    return commit, step, int(template["skipped"])
