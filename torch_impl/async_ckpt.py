"""Asynchronous sharded checkpoints that cannot tear: dcp.async_save into a fresh step
directory, committed by ckpt.commit once every rank's write is durable. See
reference/async_ckpt.py for the protocol both trees follow (NOTE [ An async save commits
after its data is durable ]); this file says what torch does in it.

What dcp.async_save does (torch 2.13, torch/distributed/checkpoint/state_dict_saver.py):
- it stages before it returns: given a storage writer that is an AsyncStager (our
  FileSystemWriter is) or the `async_stager` passed here, it calls stage(state_dict), and
  BlockingAsyncStager.stage allocates new CPU tensors (_create_cpu_state_dict) and copies
  every entry into them (_copy_state_dict), on the caller's thread. What the background
  writes is that copy: a parameter changed right after async_save returns changes nothing
  on disk. (FileSystemWriter.stage's own comment, "the state dict is already on CPU",
  is the tempting shortcut: a stager that returns CPU tensors as they are hands the
  background the live tensors, and it writes whatever they hold when it gets there.)
- it then runs dcp.save on the staged copy in a thread of its own (one worker, a Future):
  the planning collectives, every rank's __<r>_0.distcp (fsynced), the coordinator's
  .metadata. Those collectives run on the `process_group` given, from that thread, while
  the training thread all-reduces gradients on the default group: so the saves get a
  process group of their own (AsyncSaver's), which no training collective touches.
- MODES: "copy" stages into fresh CPU memory each save; "pinned" into one page-locked
  buffer kept across saves (BlockingAsyncStager(cache_staged_state_dict=True):
  torch.empty(...).pin_memory(), which needs CUDA). A kept buffer is safe only because
  the next save waits for the previous one's commit (rule 4 of the NOTE): a staging into
  it while the previous write still reads it would put the new step's bytes into the old
  step's files.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import BlockingAsyncStager

from ckpt import commit as ckc
from ckpt import commit_policy
from common.train_loop import batches
from torch_impl import amp, loss_scaling
from torch_impl import sharded_ckpt as sc
from torch_impl.ddp import replica
from torch_impl.train_models import batch_of

PAYLOAD = sc.PAYLOAD  # an async save's files and record are a sync save's
MODES = ("copy", "pinned")
# where a seeded fault strikes in an async save: a rank SIGKILLed ("kill") or raising
# ("raise") in the background write before its data, or hanging there ("hang"); the
# coordinator SIGKILLed after every rank's data is durable, before the commit record
FAULTS = ("kill_in_write", "raise_in_write", "hang_in_write", "kill_before_commit")


class AsyncSaveError(RuntimeError):
    """Rule 5: an async save failed or was not committed in time (one line, its step)."""


def refusal(mode: str) -> str | None:
    """Why `mode` cannot run here (one line), or None."""
    if mode not in MODES:
        return f"--async-save {mode}: the staging is one of {', '.join(MODES)}"
    if mode == "pinned" and not torch.cuda.is_available():
        return ("--async-save pinned: page-locked staging needs CUDA (torch.cuda.is_available()"
                " is False here); --async-save copy stages into plain CPU memory")
    return None


def _first_line(error: BaseException) -> str:
    """The failure in one line: DCP's CheckpointException (a BaseException listing each
    failed rank's exception with its traceback) as its first rank's error."""
    if isinstance(error, CheckpointException) and error.failures:
        rank, cause = min(error.failures.items())  # (exception, its frames) on a peer
        return f"rank {rank}: {_first_line(cause[0] if isinstance(cause, tuple) else cause)}"
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


class _Writer(sc._Writer):
    """sc._Writer (one fsynced file per rank, never overwriting) whose write_data first
    calls `gate` (a test holds the write there) and records when it ran, and strikes a
    seeded fault of FAULTS before writing."""

    def __init__(self, path: Path, rank: int, fault: str | None,
                 gate: Callable[[], Any] | None, mark: Callable[[str, float, float], None]
                 ) -> None:
        super().__init__(path, rank, None)
        self.async_fault, self.gate, self.mark = fault, gate, mark

    def write_data(self, plan: Any, planner: Any) -> Any:
        if self.gate is not None:
            self.gate()
        if self.async_fault == "kill_in_write":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.async_fault == "raise_in_write":
            raise OSError(f"rank {self.my_rank}: the write failed on purpose (seeded fault)")
        if self.async_fault == "hang_in_write":
            time.sleep(3600)
        t0 = time.monotonic()
        future = super().write_data(plan, planner)
        future.wait()
        self.mark("write", t0, time.monotonic())
        return future


class AsyncSaver:
    """One rank's asynchronous saves (the module docstring; NOTE [ An async save commits
    after its data is durable ] in reference/async_ckpt.py). Every rank of `group` makes
    one, collectively (it makes the saves' own process group).

    events: (what, step, start, end) in time.monotonic() seconds (the same clock in every
    process of this machine): "wait" (for the previous commit, then the fresh directory),
    "stage" (async_save's call), "write" (this rank's data),
    "commit" (digests, gather, the record, the barrier after it). `timeout`: seconds a
    wait, and a collective of the saves' group, may take."""

    def __init__(self, group: Any, rank: int, mode: str = "copy",
                 timeout: float = 60.0) -> None:
        why = refusal(mode)
        if why is not None:
            raise ValueError(why)
        self.rank, self.mode, self.timeout = rank, mode, timeout
        members = list(range(dist.get_world_size(group)))
        self.group = dist.new_group(members, timeout=timedelta(seconds=timeout),
                                    use_local_synchronization=True)  # not 30 min
        self.stager = BlockingAsyncStager(cache_staged_state_dict=(mode == "pinned"))
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="commit")
        self.pending: tuple[int, Future] | None = None
        self.events: list[tuple[str, int, float, float]] = []
        self._lock = threading.Lock()

    def _mark(self, what: str, step: int, t0: float, t1: float) -> None:
        with self._lock:
            self.events.append((what, step, t0, t1))

    def save(self, parent: str | os.PathLike, step: int, state: Mapping[str, torch.Tensor],
             *, config: dict[str, Any] | None = None, fault: str | None = None,
             gate: Callable[[], Any] | None = None,
             after_commit: Callable[[], None] | None = None) -> None:
        """Wait for the previous save's commit (rule 4), then stage `state` (copies) and
        return; the write and the commit go on in the background. `fault` (one of FAULTS)
        strikes this rank; `gate` runs in the background before this rank's write;
        `after_commit` runs on rank 0 after the record (the run's pruning)."""
        if any(not isinstance(v, torch.Tensor) for v in state.values()):
            raise TypeError("AsyncSaver.save: every entry must be a tensor")
        t0 = time.monotonic()
        self.wait()
        directory = ckc.step_dir(parent, step)
        if self.rank == 0:
            ckc.make_fresh(parent, step)
        dist.barrier(group=self.group)  # the directory exists before any rank writes
        self._mark("wait", step, t0, time.monotonic())
        writer = _Writer(directory, self.rank, fault, gate,
                         lambda what, t0, t1: self._mark(what, step, t0, t1))
        t0 = time.monotonic()
        with sc.dcp_notices_ignored():
            upload = dcp.async_save(dict(state), storage_writer=writer,
                                    async_stager=self.stager, process_group=self.group)
        self._mark("stage", step, t0, time.monotonic())
        self.pending = (step, self.pool.submit(self._commit, parent, step, upload, fault,
                                               config, after_commit))

    def _commit(self, parent: str | os.PathLike, step: int, upload: Future,
                fault: str | None, config: dict[str, Any] | None,
                after_commit: Callable[[], None] | None) -> None:
        """The background half: DCP's future, then rules 2-3 of the NOTE."""
        upload.result()  # every file of this rank written and fsynced, .metadata on rank 0
        t0 = time.monotonic()
        directory = ckc.step_dir(parent, step)
        mine = sorted(p.name for p in directory.iterdir()
                      if p.name.startswith(f"__{self.rank}_"))
        entries = [ckc.file_entry(directory, name) for name in mine]  # fsync, SHA-256
        gathered: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(gathered, entries, group=self.group)  # all durable
        if self.rank == 0:
            if fault == "kill_before_commit":
                os.kill(os.getpid(), signal.SIGKILL)
            files = [e for es in gathered for e in es]
            files.append(ckc.file_entry(directory, ".metadata"))
            if config is not None:
                files.append(ckc.write_config(directory, config))
            ckc.commit(parent, step, len(gathered), PAYLOAD, files)
            if after_commit is not None:
                after_commit()
        dist.barrier(group=self.group)
        self._mark("commit", step, t0, time.monotonic())

    def wait(self) -> int | None:
        """Block until the pending save (if any) is committed; returns its step. A save
        that failed, or is not committed within `timeout` seconds, raises AsyncSaveError in
        one line naming the step (its data is then no checkpoint: no record names it)."""
        if self.pending is None:
            return None
        step, future = self.pending
        self.pending = None
        try:
            future.result(timeout=self.timeout)
        except FutureTimeout:
            raise AsyncSaveError(f"async save of step {step} on rank {self.rank}: not committed "
                               f"after {self.timeout:g} s (a rank hung?)") from None
        except (Exception, CheckpointException) as e:  # any failure ends the run
            raise AsyncSaveError(f"async save of step {step} on rank {self.rank} failed: "
                               f"{_first_line(e)}") from None
        return step

    def close(self) -> None:
        """Wait for the pending save, then release the threads and the staging buffer."""
        try:
            self.wait()
        finally:
            self.pool.shutdown(wait=False)
            self.stager.close()


def save_step(directory: str | os.PathLike, step: int, state: Mapping[str, torch.Tensor],
              rank: int, group: Any, *, saver: AsyncSaver | None, config: dict[str, Any],
              keep: int) -> None:
    """Commit this rank's `state` as `step`'s checkpoint, the newest `keep` kept: through
    `saver` (staged before it returns, written in the background, pruned by rank 0 after its
    commit) or, without one, in place (sharded_ckpt.save_sharded, then rank 0's prune)."""
    if saver is not None:
        saver.save(directory, step, state, config=config,
                   after_commit=lambda: commit_policy.prune(directory, keep))
        return
    sc.save_sharded(directory, step, state, rank, group, config=config)
    if rank == 0:
        commit_policy.prune(directory, keep)


def async_job(config: Any, steps: int, world_size: int, directory: str, every: int, *,
              mode: str = "copy", resume: bool = False,
              fault: tuple[str, int, int] | None = None, gate: str | float | None = None,
              timeout: float = 60.0) -> dict[str, Any]:
    """sc.ckpt_job's run (the MLP, fp16, a per-rank stream) saved with AsyncSaver every
    `every` steps. `fault` (what, rank, step): one of FAULTS strikes that rank at that
    step's save. `gate`: "next_step" holds each save's write until the rank has taken its
    next step (the parameters changed under the staged copy; the last save's write until
    the parameters are overwritten with NaN), a number delays each write that many
    seconds (the next save is asked for while this one still writes)."""
    sc.ckpt_job(config, steps, world_size, directory, every)  # its checks
    if fault is not None and fault[0] not in FAULTS:
        raise ValueError(f"async_job: fault must be one of {FAULTS}, got {fault[0]!r}")
    if gate is not None and gate != "next_step" and not isinstance(gate, float):
        raise ValueError(f"async_job: gate is 'next_step' or seconds, got {gate!r}")
    return {"kind": "async-ckpt", "runner": __name__, "config": config.to_dict(),
            "steps": steps, "world_size": world_size, "directory": directory,
            "every": every, "mode": mode, "resume": resume, "fault": fault, "gate": gate,
            "timeout": timeout}


def run(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """The async job on this rank: resume (if asked), train, save asynchronously; records
    each save's state as staged (a clone taken before the save), the final state and the
    saver's events with each step's ("compute")."""
    ws, c_seed = job["world_size"], job["config"]["seed"]
    rep = replica(job, group)
    c = rep.config
    scaler = loss_scaling.make_scaler(c.precision, "cpu", init_scale=c.init_scale,
                                      growth_interval=c.growth_interval)
    generator = torch.Generator().manual_seed(ckc.rank_seed(c_seed, rank, 0))
    start, loaded = 0, None
    if job["resume"]:
        template = sc.rank_state(rep, scaler, generator, 0, rank)
        sc.load_sharded(job["directory"], template, group)
        start = sc.apply_loaded(template, rep, scaler, generator)
        loaded = sc._snapshot(template)
    saver = AsyncSaver(group, rank, job["mode"], job["timeout"])
    data = batches(c, rep.parts.loader, batch_of)
    saved, released = {}, threading.Event()
    try:
        for step in range(start + 1, job["steps"] + 1):
            t0 = time.monotonic()
            x, y = next(data)
            torch.rand(4, generator=generator)  # the stream dropout would draw from
            rep.optimizer.zero_grad(set_to_none=True)
            with amp.autocast(amp.autocast_dtype(c.precision), "cpu"):
                loss = rep.parts.loss_fn(rep.ddp(x[rank::ws]), y[rank::ws])
            scaler.scale(loss).backward()
            scaler.step(rep.optimizer)
            scaler.update()
            saver._mark("compute", step, t0, time.monotonic())
            released.set()  # the parameters moved on: a held write may go
            if step % job["every"]:
                continue
            state = sc.rank_state(rep, scaler, generator, step, rank)
            saved[step] = sc._snapshot(state)
            fault = job["fault"]
            hit = None if fault is None or tuple(fault[1:]) != (rank, step) else fault[0]
            released = threading.Event()
            saver.save(job["directory"], step, state, fault=hit,
                       gate=_gate(job["gate"], released, job["timeout"]))
            if step == job["steps"] and job["gate"] == "next_step":
                for p in rep.params:  # no next step: the live tensors overwritten instead
                    p.detach().fill_(float("nan"))
                released.set()
        saver.close()
    finally:
        released.set()
    return {"loaded": loaded, "saved": saved, "events": saver.events,
            "final": sc._snapshot(sc.rank_state(rep, scaler, generator, job["steps"], rank))}


def _gate(gate: str | float | None, released: threading.Event, timeout: float
          ) -> Callable[[], Any] | None:
    if gate is None:
        return None
    if gate == "next_step":
        return lambda: released.wait(timeout)
    return lambda: time.sleep(float(gate))
