"""Sharded checkpoints of a DDP run that cannot tear: torch.distributed.checkpoint (dcp.save
with a FileSystemWriter, every rank writing its own file) into a fresh step directory,
committed by ckpt.commit (NOTE [ A checkpoint exists when its commit record does ]).

What torch does, and what this file adds:
- dcp.save plans the state dicts of all ranks together, writes each rank's share to
  __<rank>_0.distcp (fsynced: sync_files=True), and the coordinator (rank 0) pickles the
  global Metadata to .metadata.tmp, fsyncs it and renames it to .metadata. Into a directory
  that already holds a checkpoint this tears (test_ddp_ckpt's hazard test shows the mix):
  saves here go only into a fresh step directory, and exist only once committed.
- Replicated entries (every rank holds the same key: DDP's parameters, the optimizer, the
  scaler, the data position) are written once, by the rank DCP's planner picks
  (dedup_save_plans); per-rank entries have per-rank keys (rng/rank<r>). dcp.load's
  docstring asks every rank for the same keys ("mismatched keys may result in hangs or
  errors"); torch 2.13 plans each key where it is asked for, on save and on load (the
  resume tests, 1 to 3 ranks); were it enforced, the streams would become one tensor
  sharded by rank (a DTensor on Shard(0)).
- Loading is dcp.load into a template of the same keys, in place. The commit record's
  digests are verified first: DCP's FileSystemReader.read_metadata is pickle.load, and a
  non-tensor entry is torch.load(weights_only=False) (DefaultLoadPlanner.load_bytes), so
  every entry saved here is a tensor (no pickled bytes beside the metadata) and nothing is
  read before the digests match (NOTE [ The trust boundary ] in ckpt/commit.py).

The saved state of rank r (every entry a tensor; each rank puts every key in its own
state, and DCP writes a replicated one once):
    model/<name>            the parameters (replicated)
    optim/momentum/<i>      SGD's momentum buffer of parameter i (replicated; the MLP)
    optim/step/<i>          AdamW's step count of parameter i, float32 0-d (the GPT)
    optim/exp_avg/<i>       AdamW's first moment of parameter i (the GPT)
    optim/exp_avg_sq/<i>    AdamW's second moment of parameter i (the GPT)
    optim/lr                the group's current lr, float64 (the GPT: the schedule's
                            recursion reads it, NOTE [ Chainable schedules ])
    sched/last_epoch, sched/step_count   the schedule's position (the GPT)
    scaler/scale            the GradScaler's scale, float64 (a power of two: exact)
    scaler/growth_tracker   its growth tracker, int64
    data/epoch, data/position   the sampler's position: which global batch comes next
    step                    the steps taken
    rng/rank<r>             rank r's own generator (the stream dropout would draw from)
    bits                    bf16-sr's BitStream state, shared by every rank (replicated;
                            37 uint8: torch_impl.ddp_gpt.bits_tensor)
    bits/rank<r>            nvfp4's BitStream state of rank r (per rank, re-derived at
                            another world size: NOTE [ Random bits on N ranks ])
A scaled precision's model/<name> rows include fp8-delayed's buffers (the amax histories
and scales, replicated); bf16-sr's optim/exp_avg|exp_avg_sq/<i> are its bfloat16 moments
widened to float32 (exact).

# NOTE [ Resharding a DDP checkpoint ]
Every DDP rank holds the whole model, so resharding the replicated entries is a read: any
world size loads the same bits (DCP reads each key from the file its writer chose). The data
position is global (ranks take rows r::ws of one global batch, reference.ddp.shard), so
it carries over too. What cannot map is the per-rank randomness: rank r's stream at world
size ws is no stream at ws' != ws. The rule: at the same world size every rank restores its
own stream; at another, every rank's stream is re-derived, seeded by
ckpt.commit.rank_seed(seed, rank, step). "Exact" then means: the resumed ranks hold the
saved replicated entries bit for bit, their streams are the rule's, and (world sizes
differing) the steps after it are a ws' run from that state, not the ws run's continuation
(the reduction over ws' shards rounds differently).
"""

from __future__ import annotations

import inspect
import os
import signal
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from ckpt import CheckpointCorruptError
from ckpt import commit as ckc
from common.train_loop import batches
from torch_impl import amp, ddp_gpt, loss_scaling
from torch_impl.ddp import Replica, replica
from torch_impl.train_models import batch_of

PAYLOAD = "dcp"
FAULTS = ("after_data", "before_metadata", "before_commit")  # where a save is SIGKILLed


# dcp.save and dcp.load take `no_dist` in torch 2.11 and 2.13; 2.6 has no such argument and
# infers it the same way (no initialized process group: one process), warning "torch.distributed
# is unavailable or uninitialized" where later versions say "is disabled, unavailable or
# uninitialized" (measured on 2.6.0, 2.11.0, 2.13.0).
DCP_TAKES_NO_DIST = "no_dist" in inspect.signature(dcp.save).parameters
ONE_PROCESS_WARNING = "torch.distributed is (disabled|unavailable)"  # both texts
# torch 2.6's FileSystemWriter calls tensor.storage(), which warns; 2.11 and 2.13 do not
TYPED_STORAGE_WARNING = "TypedStorage is deprecated"


@contextmanager
def dcp_notices_ignored() -> Iterator[None]:
    """DCP's own notices silenced: one process without a process group (DCP says so), and
    torch 2.6's TypedStorage deprecation inside FileSystemWriter."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ONE_PROCESS_WARNING, UserWarning)
        warnings.filterwarnings("ignore", TYPED_STORAGE_WARNING, UserWarning)
        yield


def _no_dist() -> bool:
    return not (dist.is_available() and dist.is_initialized())


def no_dist_kwargs() -> dict[str, bool]:
    """dcp.save/load's `no_dist` where this torch takes it (see DCP_TAKES_NO_DIST)."""
    return {"no_dist": _no_dist()} if DCP_TAKES_NO_DIST else {}


class _Writer(FileSystemWriter):
    """FileSystemWriter (one file per rank, fsynced, never overwriting), with the kill
    points of the fault tests: `fault` (where, rank) SIGKILLs that rank after it wrote its
    data ("after_data") or the coordinator before the metadata ("before_metadata")."""

    def __init__(self, path: Path, rank: int, fault: tuple[str, int] | None) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, overwrite=False)
        self.my_rank, self.fault = rank, fault

    def _maybe_die(self, where: str) -> None:
        if self.fault is not None and self.fault == (where, self.my_rank):
            os.kill(os.getpid(), signal.SIGKILL)

    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)
        self._maybe_die("after_data")
        return future

    def finish(self, metadata: Any, results: Any) -> None:
        self._maybe_die("before_metadata")
        super().finish(metadata, results)


def save_sharded(parent: str | os.PathLike, step: int, state: Mapping[str, torch.Tensor],
                 rank: int, group: Any = None, fault: tuple[str, int] | None = None,
                 config: dict[str, Any] | None = None) -> Path:
    """Every rank of `group` calls this with its state: DCP writes step-<step> (fresh), each
    rank records its file's size and SHA-256, rank 0 commits; returns the step directory.
    `fault` (one of FAULTS, rank): that rank is SIGKILLed there (the kill tests).
    `config`: the run's configuration, written by rank 0 as config.json and listed in the
    record (ckpt.commit.write_config)."""
    if any(not isinstance(v, torch.Tensor) for v in state.values()):
        raise TypeError("save_sharded: every entry must be a tensor (anything else DCP "
                        "pickles, and loading would unpickle it)")
    directory = ckc.step_dir(parent, step)
    if rank == 0:
        ckc.make_fresh(parent, step)
    if not _no_dist():
        dist.barrier(group=group)
    with dcp_notices_ignored():
        dcp.save(dict(state), storage_writer=_Writer(directory, rank, fault),
                 process_group=group, **no_dist_kwargs())
    mine = sorted(p.name for p in directory.iterdir() if p.name.startswith(f"__{rank}_"))
    entries = [ckc.file_entry(directory, name) for name in mine]
    gathered: list[Any] = [entries]
    if not _no_dist():
        gathered = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, entries, group=group)
    if rank == 0:
        if fault == ("before_commit", 0):
            os.kill(os.getpid(), signal.SIGKILL)
        files = [e for es in gathered for e in es] + [ckc.file_entry(directory, ".metadata")]
        if config is not None:
            files.append(ckc.write_config(directory, config))
        ckc.commit(parent, step, len(gathered), PAYLOAD, files)
    if not _no_dist():
        dist.barrier(group=group)
    return directory


def load_sharded(parent: str | os.PathLike, template: Mapping[str, torch.Tensor],
                 group: Any = None) -> tuple[ckc.Commit, list[str]]:
    """Load the newest verified commit into `template`'s tensors in place (only its keys);
    returns the commit and the newer records passed over. Digests are verified before DCP
    reads (unpickles) anything; CheckpointDirectoryError if nothing verifies;
    CheckpointCorruptError if the verified .metadata uses a file the record does not list
    (a record that does not cover every rank's file)."""
    record, skipped = ckc.newest(parent, PAYLOAD)
    reader = FileSystemReader(record.directory)
    listed = {f.name for f in record.files}
    used = {d.relative_path for d in reader.read_metadata().storage_data.values()}
    if not used <= listed:  # the metadata (verified, now unpickled) names an unlisted file
        raise CheckpointCorruptError(f"commit record {record.path} does not list "
                                         f"{sorted(used - listed)}, which its .metadata uses")
    with dcp_notices_ignored():
        dcp.load(dict(template), storage_reader=reader,
                 process_group=group, **no_dist_kwargs())
    return record, skipped


def rank_state(rep: Replica | ddp_gpt.Replica, scaler: torch.amp.GradScaler,
               generator: torch.Generator, step: int, rank: int) -> dict[str, torch.Tensor]:
    """This rank's saved state (the module docstring's table), aliasing the live tensors
    where it can (a template for load_sharded fills them in place)."""
    state: dict[str, torch.Tensor] = {f"model/{k}": v for k, v in
                                      rep.parts.model.state_dict(keep_vars=False).items()}
    if isinstance(rep, ddp_gpt.Replica):  # AdamW and the schedule
        state.update(ddp_gpt.optimizer_state(rep.optimizer, rep.scheduler, rep.params))
    for i, p in enumerate(rep.params if isinstance(rep, Replica) else ()):
        buf = rep.optimizer.state.setdefault(p, {}).setdefault(
            "momentum_buffer", torch.zeros_like(p))
        state[f"optim/momentum/{i}"] = buf
    state["scaler/scale"] = torch.tensor(scaler.get_scale(), dtype=torch.float64)
    state["scaler/growth_tracker"] = torch.tensor(scaler._get_growth_tracker(),
                                                  dtype=torch.int64)
    sampler = rep.parts.sampler
    state["data/epoch"] = torch.tensor(sampler.epoch, dtype=torch.int64)
    state["data/position"] = torch.tensor(sampler.position, dtype=torch.int64)
    state["step"] = torch.tensor(step, dtype=torch.int64)
    state[f"rng/rank{rank}"] = generator.get_state()
    return state


def apply_loaded(state: Mapping[str, torch.Tensor], rep: Replica | ddp_gpt.Replica,
                 scaler: torch.amp.GradScaler, generator: torch.Generator) -> int:
    """Put what load_sharded filled into the objects rank_state could not alias (the
    scaler, the sampler, the generator, the GPT's lr and schedule); returns the step."""
    if isinstance(rep, ddp_gpt.Replica):
        ddp_gpt.load_optimizer_state(dict(state), rep.optimizer, rep.scheduler, rep.params)
    sd = scaler.state_dict()
    sd.update(scale=float(state["scaler/scale"]),
              _growth_tracker=int(state["scaler/growth_tracker"]))
    scaler.load_state_dict(sd)
    rep.parts.sampler.load_state_dict({**rep.parts.sampler.state_dict(),
                                       "epoch": int(state["data/epoch"]),
                                       "position": int(state["data/position"])})
    rng = [k for k in state if k.startswith("rng/")]
    if rng:
        generator.set_state(state[rng[0]])
    return int(state["step"])


def ckpt_job(config: Any, steps: int, world_size: int, directory: str, every: int,
             resume: bool = False, fault: tuple[str, int, int] | None = None
             ) -> dict[str, Any]:
    """`steps` DDP steps of `config`'s MLP (fp16, a GradScaler per rank, a per-rank stream
    drawn every step), a sharded checkpoint every `every` steps into `directory`; `resume`:
    from its newest commit first (resharding if its world size differs); `fault` (where,
    rank, step): that rank is SIGKILLed at that point of that step's save."""
    if config.model != "mlp" or config.optimizer != "SGD" or config.precision != "fp16":
        raise ValueError("ckpt_job: an MLP, optimizer 'SGD', precision 'fp16'")
    if config.batch_size % world_size or every < 1:
        raise ValueError(f"ckpt_job: batch_size {config.batch_size} must split into "
                         f"{world_size} shards, every >= 1 (got {every})")
    if fault is not None and fault[0] not in FAULTS:
        raise ValueError(f"ckpt_job: fault's point must be one of {FAULTS}, got {fault[0]!r}")
    return {"kind": "ckpt", "runner": __name__, "config": config.to_dict(), "steps": steps,
            "world_size": world_size, "directory": directory, "every": every,
            "resume": resume, "fault": fault}


def _snapshot(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}


def run(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """The ckpt job on this rank: resume (if asked), then train and save; records the state
    right after loading, each step's draws and loss, each saved state and the final state."""
    ws, c_seed = job["world_size"], job["config"]["seed"]
    rep = replica(job, group)
    c = rep.config
    scaler = loss_scaling.make_scaler(c.precision, "cpu", init_scale=c.init_scale,
                                      growth_interval=c.growth_interval)
    generator = torch.Generator().manual_seed(ckc.rank_seed(c_seed, rank, 0))
    start, loaded, record_ws = 0, None, None
    if job["resume"]:
        template = rank_state(rep, scaler, generator, 0, rank)
        record, _ = ckc.newest(job["directory"], PAYLOAD)
        record_ws = record.world_size
        if record_ws != ws:  # NOTE [ Resharding a DDP checkpoint ]: re-derived, not loaded
            del template[f"rng/rank{rank}"]
        load_sharded(job["directory"], template, group)
        start = apply_loaded(template, rep, scaler, generator)
        if record_ws != ws:
            generator.manual_seed(ckc.rank_seed(c_seed, rank, start))
        loaded = _snapshot(rank_state(rep, scaler, generator, start, rank))
    fault = None if job["fault"] is None else tuple(job["fault"])
    data = batches(c, rep.parts.loader, batch_of)  # from the sampler's (restored) position
    records, saved = [], {}
    for step in range(start + 1, job["steps"] + 1):
        x, y = next(data)
        draw = torch.rand(4, generator=generator)  # the stream dropout would draw from
        rep.optimizer.zero_grad(set_to_none=True)
        xr, yr = x[rank::ws], y[rank::ws]  # reference.ddp.shard
        with amp.autocast(amp.autocast_dtype(c.precision), "cpu"):
            loss = rep.parts.loss_fn(rep.ddp(xr), yr)
        scaler.scale(loss).backward()
        scaler.step(rep.optimizer)
        scaler.update()
        records.append({"step": step, "draw": draw, "loss": loss.detach().clone()})
        if step % job["every"] == 0:
            state = rank_state(rep, scaler, generator, step, rank)
            at = None if fault is None or fault[2] != step else (fault[0], fault[1])
            save_sharded(job["directory"], step, state, rank, group, at)
            saved[step] = _snapshot(state)
    return {"loaded": loaded, "record_world_size": record_ws, "steps": records,
            "saved": saved, "final": _snapshot(rank_state(rep, scaler, generator,
                                                          job["steps"], rank))}
