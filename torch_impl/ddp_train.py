"""`python -m parity train --world-size N --impl torch`: N gloo processes train the MLP (SGD)
or the GPT (AdamW and its schedule: torch_impl/ddp_gpt.py) under DistributedDataParallel,
with a sharded checkpoint (torch_impl/sharded_ckpt.py: DCP into a fresh step directory,
committed by ckpt.commit) every K steps, and resume from the newest commit. See
reference/ddp_train.py for the run both trees train and what is exact; this file says only
how the engine runs it.

What the engine adds:
- Each rank is a process of ranks.launch (forkserver, a FileStore rendezvous,
  gloo on the loopback); rank r names itself `mtrain-rank<r>` (/proc/self/comm, what `ps`
  shows) and ends at its next step once the process that launched it is gone (a SIGKILLed
  command leaves no rank behind writing checkpoints).
- nn.Dropout draws from torch's default CPU generator: each rank seeds its own from
  rank_seed(seed, rank, 0), and that generator's state is the rank's rng/rank<r>.
- NOTE [ DDP's buckets after a resume ]: DDP rebuilds its buckets after its first backward
  (NOTE [ DDP's reducer ] 1-2 in reference/ddp.py), and a resumed run builds a new DDP. Its
  first step would reduce in the parameter-order bucket that the uninterrupted run used only
  at step 1, and from three ranks on the ring's chunks then sum some elements in another
  order. So a resumed rank first runs one backward on zero inputs, dropout stream saved and
  restored, gradients dropped (no optimizer step, no scaler): its buckets are then rebuilt
  in the ready order before the first real step, as the uninterrupted run's are (the GPT's:
  token ids and targets all 0, recomputation and autocast as configured).
- NOTE [ Loader workers of a rank ] (below): --loader-workers K gives every rank K workers.
- A scaled precision's BitStream (nvfp4, bf16-sr) is saved as 37 bytes (ddp_gpt.bits_tensor:
  DCP saves tensors only); at another world size a per-rank stream's key is dropped from the
  template and the stream re-derived, as the dropout stream's (NOTE [ Random bits on N
  ranks ] in common/ddp_bits.py).
- --async-save: each rank's AsyncSaver (torch_impl/async_ckpt.py: dcp.async_save on a
  process group of its own) stages the state and returns; the write and the commit go on
  while the rank trains, and the next save (or the end of the run) waits for the commit.
The parent tails rank 0's step lines from a file in a temporary directory and hands them to
`log` as they come.
"""

from __future__ import annotations

import math
import multiprocessing
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import ranks
from ckpt import commit as ckc
from ckpt import commit_policy
from ckpt.policy import due
from common.ddp_bits import bits_key, rank_bits, shared
from common.ddp_gpt_state import gpt_rank_digest
from common.fp8_train import autocast_precision
from common.state_digest import sharded_state_digest
from common.train_config import TrainConfig
from common.train_loop import RanksResult, batches
from torch_impl import amp, ddp_gpt, loss_scaling
from torch_impl import ddp as tddp
from torch_impl import sharded_ckpt as sc
from torch_impl.async_ckpt import AsyncSaver, save_step
from torch_impl.data_workers import WorkerLoader
from torch_impl.state_digest import as_array
from torch_impl.train_models import batch_of

PAYLOAD = sc.PAYLOAD
_ASYNC_TIMEOUT = 600.0  # seconds a rank waits for its previous async save's commit


def train(config: TrainConfig, steps: int, world_size: int, directory: str | Path,
          every: int, *, keep: int, start: commit_policy.Start,
          log: Callable[[str], None], collective_timeout: float = 30.0,
          timeout: float = math.inf, loader_workers: int = 0,
          async_save: str | None = None) -> RanksResult:
    """Run the N-rank training (the module docstring) from `start` (ckpt.commit_policy's
    decision, taken before) to `steps`; ranks.DDPError if a rank fails, or if the ranks are
    still running after `timeout` seconds (none by default: a run takes as long as it takes;
    a hung collective ends at collective_timeout). `loader_workers`: DataLoader worker
    processes per rank, each rank fetching the global batch (NOTE [ Loader workers of a
    rank ]). `async_save` (a mode of torch_impl.async_ckpt.MODES): the checkpoints saved
    in the background (NOTE [ An async save commits after its data is durable ])."""
    return _run_ranks(lambda rank0_log: train_job(
        config, steps, world_size, directory, every, keep=keep,
        resume=None if start.record is None else start.record.step, log=rank0_log,
        loader_workers=loader_workers, async_save=async_save),
        world_size, log, "ddp", timeout=timeout, collective_timeout=collective_timeout)


def _run_ranks(make_job: Callable[[Path], dict[str, Any]], world_size: int,
              log: Callable[[str], None], what: str, *, timeout: float,
              collective_timeout: float) -> RanksResult:
    """Launch the job `make_job` builds (given the path rank 0 logs its lines to, which are
    passed on to `log` as they come) on `world_size` gloo ranks; the run's result, every
    rank's digest the same (ranks.DDPError naming `what` if not, or if a rank fails)."""
    with tempfile.TemporaryDirectory(prefix=f"mirrortrain-{what}-") as tmp:
        job = make_job(Path(tmp) / "rank0.log")
        Path(job["log"]).touch()
        stop = threading.Event()
        tail = threading.Thread(target=_tail, args=(Path(job["log"]), log, stop), daemon=True)
        tail.start()
        try:
            results = ranks.launch([job], world_size, timeout=timeout,
                                   collective_timeout=collective_timeout)
        finally:
            stop.set()
            tail.join()
    digests = [r[0]["digest"] for r in results]
    if len(set(digests)) != 1:
        raise ranks.DDPError(f"{what}: the ranks end in different states: digests {digests}")
    first = results[0][0]
    return RanksResult(first["step"], digests[0], first["skipped"])


def train_job(config: TrainConfig, steps: int, world_size: int, directory: str | Path,
              every: int, *, keep: int, resume: int | None, log: str | Path,
              loader_workers: int = 0, async_save: str | None = None,
              record: bool = False) -> dict[str, Any]:
    """The job every rank runs (`run`): the run of `config` to `steps` in `directory`,
    resuming its commit of step `resume` (None: from step 0), rank 0 appending its step
    lines to the file `log`. train() launches one; a test may launch several in a row.
    `record` (the GPT's tests): the rank's result also holds its initial parameters, every
    step's local and reduced gradients, buckets, lr, skip and amax vector, and its final
    parameters and state (_recorded)."""
    return {"kind": "cli-train", "runner": __name__, "config": config.to_dict(),
            "steps": steps, "world_size": world_size, "directory": str(directory),
            "every": every, "keep": keep, "loader_workers": loader_workers,
            "resume": resume, "log": str(log), "async_save": async_save, "record": record}


def _tail(path: Path, log: Callable[[str], None], stop: threading.Event) -> None:
    """Hand each complete line rank 0 appends to `path` to `log`, until `stop` and EOF."""
    with path.open(encoding="utf-8") as f:
        pending = ""
        while True:
            done = stop.is_set()  # read once more after the launch ended
            pending += f.read()
            *lines, pending = pending.split("\n")
            for line in lines:
                log(line)
            if done:
                return
            time.sleep(0.02)


def _name(rank: int) -> None:
    try:  # Linux: what ps and /proc/<pid>/comm show (the kill tests find ranks by it)
        Path("/proc/self/comm").write_text(f"mtrain-rank{rank}")
    except OSError:
        pass


def _orphaned() -> bool:
    parent = multiprocessing.parent_process()
    return parent is not None and not parent.is_alive()


def _state(rep: tddp.Replica | ddp_gpt.Replica, scaler: torch.amp.GradScaler, step: int,
           skipped: int, rank: int) -> dict[str, torch.Tensor]:
    state = sc.rank_state(rep, scaler, torch.default_generator, step, rank)
    state["skipped"] = torch.tensor(skipped, dtype=torch.int64)
    if isinstance(rep, ddp_gpt.Replica):  # nvfp4's or bf16-sr's bits
        state.update(ddp_gpt.bits_state(rep, rank))
    return state


def _load_bits(state: dict[str, torch.Tensor], rep: tddp.Replica | ddp_gpt.Replica,
               rank: int, resharded: bool, step: int) -> None:
    """The rank's BitStream from its loaded entry, or re-derived at `step` where another
    world size saved a per-rank one (NOTE [ Random bits on N ranks ])."""
    bits, c = getattr(rep, "bits", None), rep.config
    if bits is None:
        return
    if resharded and not shared(c.precision):
        bits.load(rank_bits(c.seed, c.precision, rank, step).state())
    else:
        bits.load(ddp_gpt.bits_dict(state[bits_key(c.precision, rank)]))


def _rebuild_buckets(rep: tddp.Replica | ddp_gpt.Replica, shard_rows: int) -> None:
    """NOTE [ DDP's buckets after a resume ]: one backward whose gradients are dropped (and
    whatever it moved: the dropout stream, a BitStream, the delayed-scaling buffers)."""
    c, rng = rep.config, torch.get_rng_state()
    bits = getattr(rep, "bits", None)
    drawn = None if bits is None else bits.state()
    buffers = {name: b.detach().clone() for name, b in rep.parts.model.named_buffers()}
    if c.model == "gpt":  # token ids and next tokens, all 0
        x = torch.zeros(shard_rows, rep.parts.model.config.block_size, dtype=torch.int64)
        y = torch.zeros_like(x)
    else:
        x = torch.zeros(shard_rows, c.sizes[0])
        y = torch.zeros(shard_rows, dtype=torch.int64) if c.loss == "cross_entropy" else \
            torch.zeros(shard_rows, c.sizes[-1])
    with amp.autocast(amp.autocast_dtype(autocast_precision(c.precision)), "cpu"):
        loss = rep.parts.loss_fn(rep.ddp(x), y)
    loss.backward()
    rep.optimizer.zero_grad(set_to_none=True)
    torch.set_rng_state(rng)
    if bits is not None:
        bits.load(drawn)
    with torch.no_grad():
        for name, b in rep.parts.model.named_buffers():
            b.copy_(buffers[name])


# NOTE [ Loader workers of a rank ]
# With --loader-workers K every rank fetches the global batch through its own WorkerLoader of
# K processes (torch_impl/data_workers.py) and trains on its rows r::N of it, so a run of N
# ranks has N K workers. A rank is a daemonic process of ranks.launch, and Python refuses a
# daemonic process children; the rank clears its own daemon flag before its workers start
# (its launcher still ends it: ranks.launch kills what outlives the launch, and a rank
# whose launcher is gone ends at its next step). The checkpoint holds the consumed
# position (NOTE [ Consumed position ] in reference/data.py), so the batches, the saved
# states and the digest are those of 0 workers.


def _workers(rep: tddp.Replica | ddp_gpt.Replica, workers: int) -> None:
    """NOTE [ Loader workers of a rank ]: the rank's loader fetched by `workers` processes."""
    multiprocessing.current_process().daemon = False
    parts, c = rep.parts, rep.config
    parts.loader = WorkerLoader(parts.task, parts.sampler, c.batch_size, drop_last=True,
                                generator=torch.Generator(), num_workers=workers)


def run(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """One rank of the run: resume (if asked), then train, checkpoint and log."""
    _name(rank)
    ws, every, steps = job["world_size"], job["every"], job["steps"]
    c = TrainConfig(**{k: tuple(v) if k == "sizes" else v for k, v in job["config"].items()})
    rep = ddp_gpt.replica(c, group) if c.model == "gpt" else tddp.replica(job, group)
    scaler = loss_scaling.make_scaler(autocast_precision(c.precision), "cpu",
                                      init_scale=c.init_scale, growth_interval=c.growth_interval)
    torch.manual_seed(ckc.rank_seed(c.seed, rank, 0))  # this rank's dropout stream
    step, skipped = 0, 0
    if job["resume"] is not None:
        template = _state(rep, scaler, 0, 0, rank)
        record, _ = ckc.newest(job["directory"], PAYLOAD)
        if record.step != job["resume"]:
            raise RuntimeError(f"{job['directory']}: its newest commit is step {record.step}, "
                               f"the command chose step {job['resume']} (changed since?)")
        resharded = record.world_size != ws
        if resharded:  # NOTE [ Resharding a DDP checkpoint ]: re-derived
            del template[f"rng/rank{rank}"]
            if not shared(c.precision):
                template.pop(bits_key(c.precision, rank), None)
        sc.load_sharded(job["directory"], template, group)
        step = sc.apply_loaded(template, rep, scaler, torch.default_generator)
        _load_bits(template, rep, rank, resharded, step)
        skipped = int(template["skipped"])
        if record.world_size != ws:
            torch.manual_seed(ckc.rank_seed(c.seed, rank, step))
        _rebuild_buckets(rep, c.batch_size // ws)
    if job.get("loader_workers"):
        _workers(rep, job["loader_workers"])
    mode = job.get("async_save")
    saver = None if mode is None else AsyncSaver(group, rank, mode, timeout=_ASYNC_TIMEOUT)
    log = open(job["log"], "a", encoding="utf-8") if rank == 0 else None
    data = batches(c, rep.parts.loader, batch_of)  # from the sampler's (restored) position
    recorded: list[dict[str, Any]] | None = [] if job.get("record") else None
    try:
        while step < steps:
            if _orphaned():
                raise RuntimeError("the process that launched this rank is gone")
            x, y = next(data)
            if isinstance(rep, ddp_gpt.Replica):
                lr = rep.optimizer.param_groups[0]["lr"]
                record = ddp_gpt.ddp_step(rep, scaler, x, y, rank=rank, world_size=ws)
                if not record.skipped:  # the schedule counts applied updates
                    rep.scheduler.step()
                if recorded is not None:
                    recorded.append(_step_record(rep, record, lr))
            else:
                record = tddp.ddp_step(rep, scaler, x, y, rank=rank, world_size=ws)
            scale, skip = record.scale, record.skipped
            step, skipped = step + 1, skipped + int(skip)
            mean = record.loss.double()
            dist.all_reduce(mean, group=group)  # the global batch's loss: the shards' mean
            if log is not None:
                log.write(f"step {step} loss {float(mean) / ws:.6g} scale {scale:g} "
                          f"skipped {int(skip)} (total {skipped})\n")
                log.flush()
            if due(step, steps, every):  # with a saver: staged, written meanwhile
                save_step(job["directory"], step, _state(rep, scaler, step, skipped, rank),
                          rank, group, saver=saver, config=job["config"], keep=job["keep"])
        if saver is not None:
            saver.close()  # the last save committed (or its error raised) before the digest
    finally:
        if log is not None:
            log.close()
        close = getattr(rep.parts.loader, "close", None)
        if close is not None:  # a WorkerLoader's processes end here
            close()
    final = _state(rep, scaler, step, skipped, rank)
    digest = gpt_rank_digest if c.model == "gpt" else sharded_state_digest
    result = {"step": step, "skipped": skipped, "digest": digest(final, as_array)}
    if recorded is not None and isinstance(rep, ddp_gpt.Replica):
        result.update(_recorded(rep, recorded, final))
    return result


def _step_record(rep: ddp_gpt.Replica, record: tddp.StepRecord, lr: float) -> dict[str, Any]:
    """What a recorded job keeps of a step (the keys of torch_impl/ddp_jobs.py's gpt_job)."""
    return {"local": record.local, "reduced": record.reduced, "buckets": record.buckets,
            "loss": record.loss, "scale": record.scale, "skipped": record.skipped, "lr": lr,
            "amax": None if rep.amax is None else rep.amax.clone()}


def _recorded(rep: ddp_gpt.Replica, steps: list[dict[str, Any]],
              final: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A recorded job's result beside the digest: the initial parameters, every step, the
    final parameters, AdamW's or BF16SR's entries ("optimizer") and the whole final state."""
    state = {k: v.detach().clone() for k, v in final.items()}
    return {"initial": rep.initial, "steps": steps,
            "final": [p.detach().clone() for p in rep.params],
            "optimizer": {k: v for k, v in state.items() if k.startswith(("optim/", "sched/"))},
            "state": state}
