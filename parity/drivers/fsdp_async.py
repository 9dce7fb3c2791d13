"""The GPT's FSDP2 run saving asynchronously, observed (claim fsdp.gpt_async_resume,
parity/test_fsdp_async.py): the command's run in each tree with its AsyncSaver.save
watched from outside (each save's state cloned as it was handed over, each background write
held until the rank's shards moved on, or delayed, a seeded fault passed on) and a commit
read back rank by rank. Nothing here changes what the run computes: the runs are the
command's (torch_impl/fsdp_gpt.py's run, reference/fsdp_gpt.py's train).
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ckpt import commit as ckc
from parity.drivers import fsdp_gpt as drv
from reference.fsdp_gpt_ckpt import is_sharded

# ------------------------------------------------------------------------- torch

def run(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """A torch rank's job of `job`: the command's (torch_impl/fsdp_gpt.py's run) with
    its AsyncSaver.save observed: each save's state cloned as it was handed over, each
    write held by job["gate"] ("next_step": until the rank's next step ended, the last one
    until its live parameters are NaN; seconds: a delay), job["fault"] (what, rank, step)
    struck; returns beyond the run's result the snapshots, the saver's events, when each
    step ended, whether the live parameters read NaN, and the commits there at its return."""
    import torch

    from torch_impl import async_ckpt, fsdp_gpt

    saved: dict[int, dict[str, Any]] = {}
    ended: dict[int, float] = {}
    reps, savers, nan = [], [], []
    stepped = [threading.Event()]
    real_save, real_step = async_ckpt.AsyncSaver.save, fsdp_gpt.fsdp_step

    def step(rep: Any, *args: Any, **kw: Any) -> Any:
        out = real_step(rep, *args, **kw)
        reps.append(rep)
        ended[len(ended) + 1] = time.monotonic()
        stepped[0].set()  # the parameters moved on: a held write may go
        return out

    def save(self: Any, parent: Any, at: int, state: dict[str, Any], **kw: Any) -> None:
        savers.append(self)
        saved[at] = {k: local(v) for k, v in state.items()}
        released = stepped[0] = threading.Event()
        if job["gate"] == "next_step":
            kw["gate"] = lambda: released.wait(60)
        elif job["gate"] is not None:
            kw["gate"] = lambda: time.sleep(job["gate"])
        if job["fault"] is not None and tuple(job["fault"][1:]) == (rank, at):
            kw["fault"] = job["fault"][0]
        real_save(self, parent, at, state, **kw)
        if job["gate"] == "next_step" and at == job["steps"]:  # no next step: NaN instead
            with torch.no_grad():
                for k, v in state.items():
                    if k.startswith("model/"):
                        v.to_local().fill_(float("nan"))
            nan.append(all(bool(torch.isnan(p.to_local()).all()) for p in reps[-1].params))
            released.set()

    async_ckpt.AsyncSaver.save, fsdp_gpt.fsdp_step = save, step  # this job only
    try:
        out = fsdp_gpt.run(job, rank, group)
    finally:
        async_ckpt.AsyncSaver.save, fsdp_gpt.fsdp_step = real_save, real_step
    records = [p.name for p in ckc.records(job["directory"])]
    return {**out, "saved": saved, "ended": ended, "nan": nan, "records": records,
            "returned": time.monotonic(), "events": savers[0].events if savers else []}


def local(v: Any) -> Any:
    """This rank's rows of a DTensor (a plain tensor as it is), cloned."""
    return (v.to_local() if hasattr(v, "to_local") else v).detach().clone()


def job(directory: Path, world_size: int, steps: int, every: int, resume: int | None,
         mode: str | None = "copy", gate: str | float | None = None,
         fault: tuple[str, int, int] | None = None) -> dict[str, Any]:
    """The command's job (torch_impl/fsdp_gpt.py's train_job) of drv.RESUME_FP16 in
    `directory`, run by `run` below: `gate` and `fault` as run takes them."""
    from torch_impl.fsdp_gpt import train_job

    directory.mkdir(parents=True, exist_ok=True)
    return {**train_job(drv.RESUME_FP16, steps, world_size, directory, every, keep=10,
                        resume=resume, log=directory.parent / f"{directory.name}.log",
                        async_save=mode),
            "runner": __name__, "gate": gate, "fault": fault}



def read_back(directory: Path, step: int, rank: int, world_size: int) -> dict[str, Any]:
    """Rank `rank`'s state in the commit of `step` (verified), read here: every saved
    tensor in full, then the sharded entries cut to the rank's chunk (torch.chunk's rule)."""
    import torch
    import torch.distributed.checkpoint as dcp

    from torch_impl import sharded_ckpt as sc

    record = ckc.read_record(ckc.record_path(directory, step))
    ckc.verify(record)
    reader = dcp.FileSystemReader(record.directory)
    full = {k: torch.zeros(m.size, dtype=m.properties.dtype)
            for k, m in reader.read_metadata().state_dict_metadata.items()}
    with sc.dcp_notices_ignored():
        dcp.load(full, storage_reader=reader, **sc.no_dist_kwargs())
    out = {}
    for k, v in full.items():
        if is_sharded(k):
            chunks = torch.chunk(v, world_size)
            v = chunks[rank] if rank < len(chunks) else v[:0]
        out[k] = v
    return out



# ------------------------------------------------------------------------- the reference

@contextlib.contextmanager
def observed(gate: str | float, last: int) -> Iterator[dict[str, Any]]:
    """The reference run's AsyncSaver.save observed as `run` observes torch's: each save's
    states copied as handed over, each write held by `gate` ("next_step": until the next
    step ended, the one of step `last` until the live shards are NaN; seconds: a delay):
    the snapshots ("saved"), when each step ended ("ended"), the savers."""
    from reference import async_ckpt as ra
    from reference import fsdp_gpt as rf

    seen: dict[str, Any] = {"saved": {}, "ended": {}, "savers": [], "ranks": []}
    stepped = [threading.Event()]
    real_save, real_step = ra.AsyncSaver.save, rf.fsdp_step

    def step(ranks: Any, *args: Any, **kw: Any) -> Any:
        out = real_step(ranks, *args, **kw)
        seen["ranks"].append(ranks)
        seen["ended"][len(seen["ended"]) + 1] = time.monotonic()
        stepped[0].set()
        return out

    def save(self: Any, parent: Any, at: int, states: list[dict], **kw: Any) -> None:
        seen["savers"].append(self)
        seen["saved"][at] = [{k: copy.deepcopy(v) if k.startswith("rng/")
                              else np.array(v, copy=True) for k, v in s.items()}
                             for s in states]
        released = stepped[0] = threading.Event()
        kw["gate"] = ((lambda: released.wait(60)) if gate == "next_step"
                      else lambda: time.sleep(float(gate)))
        real_save(self, parent, at, states, **kw)
        if gate == "next_step" and at == last:  # no next step: NaN over the shards
            for shard in seen["ranks"][-1].shards:
                for p in shard:
                    p.data[...] = np.nan
            released.set()

    ra.AsyncSaver.save, rf.fsdp_step = save, step  # this run only
    try:
        yield seen
    finally:
        ra.AsyncSaver.save, rf.fsdp_step = real_save, real_step

