"""Data parallel on the real engine: N processes on this machine, torch.distributed over gloo
on 127.0.0.1, DistributedDataParallel of the torch tree's MLP. See reference/ddp.py for the
arithmetic (NOTE [ gloo's ring segments ], NOTE [ DDP's reducer ]); this file only runs it.

What the engine does that the reference states: the ring's order is inside gloo's C++
(gloo/allreduce.cc), the pre-division and the buckets inside DDP's C++ Reducer. The
reference cannot see them; it mirrors them, and parity/test_ddp.py compares the bits.

`launch(jobs, world_size)` starts world_size processes (forkserver) that rendezvous through a
FileStore in a fresh temporary directory (no port to race for; gloo's own sockets bind to
the loopback, GLOO_SOCKET_IFNAME=lo) and run each job in turn, then returns what every rank
recorded, loaded with torch.load(weights_only=True). A job with a smaller world size runs on
a subgroup of ranks 0..w-1 (dist.new_group), so one launch covers several world sizes.
Jobs: `allreduce_job` (dist.all_reduce of seeded tensors), `train_job` (DDP training
steps), `fault_job` (a rank raises, is SIGKILLed, or hangs: for the reliability tests); a
job made in another file names the module whose `run(job, rank, group)` runs it
(job["runner"]: torch_impl.ddp_scaler's scaler jobs, torch_impl.sharded_ckpt's checkpoint
jobs, torch_impl.ddp_train's `train --world-size N` ranks, which build on `replica` and
common.train_loop's `batches`).
Any failing rank ends the whole launch with DDPError naming the rank; nothing outlives it.
"""

from __future__ import annotations

import importlib
import os
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from common.train_config import TrainConfig
from common.train_loop import batches
from torch_impl import amp, loss_scaling
from torch_impl.format_spec import DTYPES
from torch_impl.train_models import batch_of, build

RANK_DTYPES = ("float16", "bfloat16", "float32", "float64")  # what a job's ranks reduce


class DDPError(RuntimeError):
    """A launch failed: which rank, how, and what it said."""


def allreduce_job(dtype: str, n: int, seed: int, world_size: int) -> dict[str, Any]:
    """dist.all_reduce (sum) of n elements of `dtype`; rank r's values are seeded by (seed, r):
    N(0, 1) times a power of two in [2^-8, 2^8], finite in every dtype."""
    if dtype not in RANK_DTYPES or n < 1:
        raise ValueError(f"allreduce_job: dtype one of {RANK_DTYPES}, n >= 1; got {dtype!r}, {n}")
    return {"kind": "allreduce", "dtype": dtype, "n": n, "seed": seed, "world_size": world_size}


def train_job(config: TrainConfig, steps: int, world_size: int,
              gradient_as_bucket_view: bool = False) -> dict[str, Any]:
    """`steps` DDP steps of `config`'s MLP; the loader's global batch is split by rank
    (reference.ddp.shard's stride); SGD as config.optimizer must say, constant lr, no dropout.
    `gradient_as_bucket_view`: DDP's option, with zero_grad(set_to_none=False) (else the
    gradients never alias their bucket views)."""
    if config.model != "mlp" or config.optimizer != "SGD" or config.dropout != 0.0:
        raise ValueError("train_job: an MLP, optimizer 'SGD', dropout 0 (each rank would need "
                         "its own dropout stream)")
    if config.batch_size % world_size:
        raise ValueError(f"train_job: batch_size {config.batch_size} does not split into "
                         f"{world_size} equal shards")
    return {"kind": "train", "config": config.to_dict(), "steps": steps,
            "world_size": world_size, "gradient_as_bucket_view": gradient_as_bucket_view}


def fault_job(rank: int, how: str, world_size: int) -> dict[str, Any]:
    """Rank `rank` raises ("raise"), SIGKILLs itself ("kill") or hangs ("hang") before an
    all_reduce the others wait in."""
    if how not in ("raise", "kill", "hang"):
        raise ValueError(f"fault_job: how must be 'raise', 'kill' or 'hang', got {how!r}")
    return {"kind": "fault", "rank": rank, "how": how, "world_size": world_size}


def launch(jobs: list[dict[str, Any]], world_size: int, timeout: float = 60.0,
           collective_timeout: float = 30.0, backend: str = "gloo"
           ) -> list[list[dict[str, Any]]]:
    """results[rank][job] of running `jobs` on world_size gloo processes.

    The launch ends when every rank has exited 0, or at the first rank that fails: a rank
    that raised (its traceback's last line), died of a signal, or a launch still running
    after `timeout` seconds; then every rank still running is killed and DDPError says
    which rank failed and how. Collectives time out after `collective_timeout` seconds
    (init_process_group's timeout), so a hung peer ends its partners' waits too.
    `backend` "nccl": rank r on cuda:r (one GPU per rank), for allreduce jobs.
    """
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"launch: backend must be 'gloo' or 'nccl', got {backend!r}")
    if world_size < 1 or any(j["world_size"] > world_size for j in jobs):
        raise ValueError(f"launch: world_size {world_size} must be >= 1 and >= every job's")
    ctx = _context()
    with tempfile.TemporaryDirectory(prefix="mirrortrain-ddp-") as tmp:
        args = (world_size, tmp, jobs, collective_timeout, backend)
        procs = [ctx.Process(target=_worker, args=(r, *args), daemon=True)
                 for r in range(world_size)]
        started = []  # a start that raised (a job that cannot be pickled) leaves the rest
        try:
            for p in procs:
                p.start()
                started.append(p)
            _wait(procs, Path(tmp), timeout)
            return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=True)
                    for r in range(world_size)]
        finally:  # only a started process can be joined: the error above stays the one seen
            for p in started:
                if p.is_alive():
                    p.kill()
                p.join(10)


def _context() -> Any:
    """forkserver, its server preloaded with torch, DDP's lazy torch._dynamo import, this
    module and the runner modules (torch_impl.fsdp: FSDP2's imports; sharded_ckpt: DCP's):
    each rank is then a fork of a clean single-threaded process (no OpenMP pool, no CUDA),
    and pays no import; the server starts once per parent process."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "torch_impl.ddp",
                                "torch_impl.ddp_scaler", "torch_impl.fsdp",
                                "torch_impl.sharded_ckpt", "torch_impl.ddp_train"])
    return ctx


def _wait(procs: list, tmp: Path, timeout: float) -> None:
    """Until all exit 0; DDPError at the first failure or at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.exitcode for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            running = [r for r, c in enumerate(codes) if c is None]
            raise DDPError(_failure(failed, codes, tmp, running))
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            running = [r for r, c in enumerate(codes) if c is None]
            raise DDPError(f"ddp: ranks {running} still running after {timeout:g} s "
                           "(a hung peer?): killed")
        time.sleep(0.02)


def _failure(failed: list[int], codes: list, tmp: Path, running: list[int]) -> str:
    """The culprit: a rank killed by a signal, else the rank whose error came first."""
    still = f"; ranks {running} were still running and are killed" if running else ""
    for r in failed:
        if codes[r] < 0:
            return f"ddp: rank {r} was killed by {signal.Signals(-codes[r]).name}{still}"
    errors = []
    for r in failed:
        path = tmp / f"rank{r}.err"
        if path.exists():
            when, _, message = path.read_text(encoding="utf-8").partition("\n")
            errors.append((float(when), r, message.strip()))
    if not errors:
        return f"ddp: rank {failed[0]} exited with code {codes[failed[0]]}{still}"
    _, r, message = min(errors)
    return f"ddp: rank {r} failed: {message}{still}"


def _worker(rank: int, world_size: int, tmp: str, jobs: list[dict[str, Any]],
            collective_timeout: float, backend: str) -> None:
    """One rank: rendezvous, run the jobs, save the results; on an error write its time and
    last line to rank<r>.err and exit 1."""
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's sockets on the loopback
        torch.set_num_threads(1)  # the claims' setting (parity/setting.py)
        store = dist.FileStore(os.path.join(tmp, "store"), world_size)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        timeout = timedelta(seconds=collective_timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
        groups: dict[int, Any] = {world_size: None}  # None: the default group
        results = []
        for job in jobs:
            w = job["world_size"]
            if w not in groups:  # every rank calls new_group, members or not; its timeout
                groups[w] = dist.new_group(list(range(w)), timeout=timeout)  # not 30 min
            if rank >= w:  # not in this job's subgroup
                results.append({})
                continue
            results.append(_runner(job)(job, rank, groups[w]))
        torch.save(results, os.path.join(tmp, f"rank{rank}.pt"))
        # every rank reaches the teardown together: a rank that destroyed its group while a
        # peer still held it once left that peer waiting in destroy_process_group for good
        # (torch 2.6, under load, in a 3-rank train), where no collective timeout applies
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as error:  # reported to the parent, then exit 1
        last = traceback.format_exception_only(type(error), error)[-1].strip()
        Path(tmp, f"rank{rank}.err").write_text(f"{time.time()!r}\n{last}\n", encoding="utf-8")
        os._exit(1)


def _allreduce(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    g = torch.Generator().manual_seed(job["seed"] * 1_000_003 + rank)
    n = job["n"]
    values = torch.randn(n, generator=g, dtype=torch.float64)
    values = values * torch.exp2(torch.randint(-8, 9, (n,), generator=g).double())
    t = values.to(DTYPES[job["dtype"]])
    before = t.clone()
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, group=group)
    return {"input": before, "output": t.cpu()}


@dataclass
class Replica:
    """One rank's side of a DDP run: its config, model parts, parameters (and their initial
    values), the DDP wrapper, SGD, and `local`: the rank's local gradient of each parameter
    at the last backward (a tensor hook sees it before AccumulateGrad and DDP's reducer)."""

    config: TrainConfig
    parts: Any
    params: list[torch.nn.Parameter]
    initial: list[torch.Tensor]
    ddp: DistributedDataParallel
    optimizer: torch.optim.SGD
    local: dict[int, torch.Tensor]


def replica(job: dict[str, Any], group: Any, gradient_as_bucket_view: bool = False) -> Replica:
    """The model of job["config"] (its seed: the same on every rank) under DDP on `group`,
    SGD with momentum 0.9, and the local-gradient hooks."""
    c = TrainConfig(**{k: tuple(v) if k == "sizes" else v for k, v in job["config"].items()})
    parts = build(c, torch.Generator().manual_seed(c.seed), torch.device("cpu"),
                  torch.Generator())
    params = list(parts.model.parameters())
    initial = [p.detach().clone() for p in params]
    ddp = DistributedDataParallel(parts.model, process_group=group,  # bucket_cap_mb=25
                                  gradient_as_bucket_view=gradient_as_bucket_view)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=c.lr, momentum=0.9)
    local: dict[int, torch.Tensor] = {}
    for i, p in enumerate(params):
        p.register_hook(lambda g, i=i: local.__setitem__(i, g.detach().clone()))
    return Replica(c, parts, params, initial, ddp, optimizer, local)


def _train(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """DDP steps; records each step's local gradients, the reduced .grad, and DDP's buckets."""
    ws, as_view = job["world_size"], job["gradient_as_bucket_view"]
    rep = replica(job, group, as_view)
    c, loss_fn, params = rep.config, rep.parts.loss_fn, rep.params
    scaler = loss_scaling.make_scaler(c.precision, "cpu", init_scale=c.init_scale,
                                      growth_interval=c.growth_interval)
    index = {id(p): i for i, p in enumerate(params)}
    steps: list[dict[str, Any]] = []
    data = batches(c, rep.parts.loader, batch_of)
    while len(steps) < job["steps"]:
        x, y = next(data)
        rep.optimizer.zero_grad(set_to_none=not as_view)
        xr, yr = x[rank::ws], y[rank::ws]  # reference.ddp.shard
        with amp.autocast(amp.autocast_dtype(c.precision), "cpu"):
            output = rep.ddp(xr)
            loss = loss_fn(output, yr)
        scaler.scale(loss).backward()
        buckets = [[index[id(p)] for p in b.parameters()]
                   for b in rep.ddp.reducer._get_zeros_like_grad_buckets()]
        steps.append({"local": [rep.local[i] for i in range(len(params))],
                      "reduced": [p.grad.detach().clone() for p in params],
                      "buckets": buckets, "loss": loss.detach().clone(), "x": xr.clone(),
                      "y": yr.clone(), "output": output.detach().clone()})
        scaler.unscale_(rep.optimizer)
        scaler.step(rep.optimizer)
        scaler.update()
    return {"initial": rep.initial, "steps": steps,
            "final": [p.detach().clone() for p in params]}


def _fault(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    if rank == job["rank"]:
        if job["how"] == "raise":
            raise ValueError(f"rank {rank} raises on purpose (fault_job)")
        if job["how"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3600)  # "hang": the others wait in all_reduce until their timeout
    t = torch.ones(4)
    dist.all_reduce(t, group=group)
    return {"output": t}


_RUN = {"allreduce": _allreduce, "train": _train, "fault": _fault}


def _runner(job: dict[str, Any]) -> Any:
    """The job's runner: _RUN's, or `run` of the module a job of another file names
    (job["runner"], e.g. torch_impl.ddp_scaler's scaler jobs: it imports this module)."""
    if "runner" in job:
        return importlib.import_module(job["runner"]).run
    return _RUN[job["kind"]]
