"""The checkpoint of the GPT's FSDP2 run over simulated ranks (reference/fsdp_gpt.py): each
rank's saved state, putting a loaded one back, the joined state the digest reads, and the
load of a commit at any world size. torch_impl/fsdp_gpt_ckpt.py is the same on the engine
(DCP of get_state_dict's DTensors).

A rank's state is the table of torch_impl/sharded_ckpt.py. Its SHARDED entries hold only
the rank's rows (dim-0 chunk r of NOTE [ FSDP2's shards ], unpadded): model/<name> and
AdamW's optim/exp_avg/<i>, optim/exp_avg_sq/<i>. Every other entry is replicated (the same
on every rank): AdamW's 0-d step counts, the lr, the schedule, the scaler's scale and growth
tracker, the data position, the step, the skipped count, the model's buffers (fp8-delayed's
histories and scales, model/<name> too: fully_shard shards parameters only); rng/rank<r>
and nvfp4's bits/rank<r> are the rank's own (NOTE [ Scaled GEMMs under FSDP2 ] in
reference/fsdp_gpt.py).
(`ranks` below is reference.fsdp_gpt.Ranks, typed Any: that module imports this one.)

# NOTE [ Resharding an FSDP checkpoint ]
A commit of ws ranks resumed at ws' ranks. The sharded entries: rank r's rows are chunk r
of the full tensor, so the full tensor is the ws saved chunks concatenated in rank order
(the padding was never saved), and rank r' at ws' takes chunk r' of it by the same rule at
ws' (c' = ceil(d0 / ws') rows a chunk, the last short or empty). A copy of rows: exact.
The replicated entries are a read, as in NOTE [ Resharding a DDP checkpoint ]
(torch_impl/sharded_ckpt.py), and the streams follow that NOTE's rule: the same world size
restores every rank's own, another re-derives every rank's from
ckpt.commit.rank_seed(seed, rank, step). torch gets the rows from DCP: each rank's template
is its DTensors at ws', whose global offsets DCP's planner reads, so every rank reads the
parts of the saved chunks that overlap its own. Exact then means: every resumed rank holds
its rows of the saved full tensors and the saved replicated entries bit for bit, its stream
is the rule's; the steps after are a ws' run from that state (a mean over ws' shards rounds
otherwise than over ws), not the ws run's continuation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ckpt import commit as ckc
from common.ddp_bits import bits_key, rank_bits
from common.fp8_train import DELAYED_TENSORS
from reference import ddp_gpt, resume
from reference import fsdp as rfsdp
from reference import sharded_ckpt as sharded

SHARDED = ("model/", "optim/exp_avg/", "optim/exp_avg_sq/")  # the prefixes of a rank's rows
BUFFERS = tuple(f"fp8_{b}_{t}" for t in DELAYED_TENSORS for b in ("amax_history", "scale"))
OWN = ("rng/", "bits/")  # a rank's own streams: never joined, re-derived at another size


def is_sharded(key: str) -> bool:
    """Whether entry `key` holds a rank's rows (the module docstring): a model entry that is
    a parameter, not a buffer (replicated)."""
    return key.startswith(SHARDED) and key.rsplit(".", 1)[-1] not in BUFFERS


def rank_state(ranks: Any, rank: int, step: int, skipped: int = 0) -> dict[str, Any]:
    """Rank `rank`'s saved state: model/<name> its unpadded
    rows, AdamW's buffers of its shards and the schedule (ddp_gpt.optimizer_state), the
    scaler's scale and growth tracker (fp32, bf16: 1 and 0), the data position, the step,
    the skipped steps, its stream (torch_impl/sharded_ckpt.py's table)."""
    names = [n for n, _ in ranks.replicas[rank].named_parameters()]
    state: dict[str, Any] = {f"model/{n}": p.data.copy()
                             for n, p in zip(names, ranks.shards[rank], strict=True)}
    state.update({f"model/{n}": b.copy() for n, b in ranks.replicas[rank].named_buffers()})
    state.update(ddp_gpt.optimizer_state(ranks.optimizers[rank], ranks.schedulers[rank],
                                         ranks.shards[rank]))
    scaler = ranks.scalers[rank]
    state["scaler/scale"] = np.float64(scaler.get_scale())
    state["scaler/growth_tracker"] = np.int64(scaler._get_growth_tracker())
    sampler = ranks.parts.sampler
    state["data/epoch"] = np.int64(sampler.epoch)
    state["data/position"] = np.int64(sampler.position)
    state["step"] = np.int64(step)
    state["skipped"] = np.int64(skipped)
    state[f"rng/rank{rank}"] = ranks.rngs[rank].bit_generator.state
    if ranks.bits[rank] is not None:
        state[bits_key(ranks.config.precision, rank)] = ranks.bits[rank].state()
    return state


def apply_loaded(state: dict[str, Any], ranks: Any, rank: int) -> None:
    """Rank `rank` set from its loaded state (the data position: the run's sampler); a
    sharded entry must be this rank's rows at this world size (load_ranks cuts them); the
    bits, where load_ranks left them out (another world size), re-derived at the step."""
    names = [n for n, _ in ranks.replicas[rank].named_parameters()]
    for n, p in zip(names, ranks.shards[rank], strict=True):
        np.copyto(p.data, state[f"model/{n}"])  # into the padded shard's rows
    for n, b in ranks.replicas[rank].named_buffers():
        np.copyto(b, state[f"model/{n}"])
    ddp_gpt.load_optimizer_state(state, ranks.optimizers[rank], ranks.schedulers[rank],
                                 ranks.shards[rank])
    sd = ranks.scalers[rank].state_dict()
    if sd:  # fp16's; a disabled scaler has no state
        sd.update(scale=float(state["scaler/scale"]),
                  _growth_tracker=int(state["scaler/growth_tracker"]))
        ranks.scalers[rank].load_state_dict(sd)
    ranks.rngs[rank].bit_generator.state = state[f"rng/rank{rank}"]
    c, bits = ranks.config, ranks.bits[rank]
    if bits is not None:
        key = bits_key(c.precision, rank)
        bits.load(state[key] if key in state else
                  rank_bits(c.seed, c.precision, rank, int(state["step"])).state())


def digest_state(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The full state: every sharded entry's rows joined along dim 0 in rank order; the
    replicated entries rank 0's (the same on every rank); no stream, no per-rank bits. The
    state gpt_rank_digest reads, and what load_ranks cuts anew."""
    return {k: np.concatenate([np.asarray(s[k]) for s in states]) if is_sharded(k) else v
            for k, v in states[0].items() if not k.startswith(OWN)}


def cut(full: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """Rank `rank`'s entries of the full state at `world_size`: each sharded entry's chunk
    (NOTE [ FSDP2's shards ]: reference.fsdp.chunk_rows), the replicated ones as they are."""
    def rows(x: np.ndarray) -> np.ndarray:
        lo, hi = rfsdp.chunk_rows(x.shape[0], world_size)[rank]
        return x[lo:hi].copy()

    return {k: rows(v) if is_sharded(k) else v for k, v in full.items()}


def load_ranks(parent: str | os.PathLike, world_size: int, seed: int
               ) -> tuple[ckc.Commit, list[dict[str, Any]]]:
    """The newest verified commit's states for `world_size` simulated ranks (NOTE
    [ Resharding an FSDP checkpoint ]): at the world size that saved, its ranks' own; at
    another, every saved rank's rows joined and cut anew, the replicated entries as saved
    and the streams reference.sharded_ckpt.load_sharded re-derives (the bits: apply_loaded
    re-derives them)."""
    record, states = sharded.load_sharded(parent, world_size, seed)
    if record.world_size == world_size:
        return record, states
    saved = [resume.load_checkpoint(record.directory / f"rank-{r}.ckpt")
             for r in range(record.world_size)]  # each verified by its seal
    full = digest_state(saved)
    return record, [{**cut(full, r, world_size), f"rng/rank{r}": states[r][f"rng/rank{r}"]}
                    for r in range(world_size)]
