"""`launch(jobs, world_size)`: world_size processes on this machine, torch.distributed over
gloo on 127.0.0.1 (or NCCL, one GPU per rank), each running every job in turn.

The processes start from a forkserver and rendezvous through a FileStore in a fresh
temporary directory (no port to race for; gloo's own sockets bind to the loopback,
GLOO_SOCKET_IFNAME=lo); each runs every job and saves what it returned, which the launch
loads back with torch.load(weights_only=True). A job with a smaller world size runs on a
subgroup of ranks 0..w-1 (dist.new_group), so one launch covers several world sizes.
A job is a dict with "world_size" and "runner": the module whose `run(job, rank, group)`
runs it on each rank (torch_impl.ddp_jobs, torch_impl.fsdp, torch_impl.ddp_scaler,
torch_impl.sharded_ckpt, torch_impl.ddp_train, ranks.faults); the launcher knows no kind
of job. Any failing rank ends the whole launch with DDPError naming the rank; nothing
outlives it.
"""

from __future__ import annotations

import importlib
import os
import signal
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BACKENDS = ("gloo", "nccl")
# What the forkserver imports once, before it forks a rank: torch, DDP's lazy torch._dynamo
# import, this module and the runners the project's jobs name (FSDP2's imports in
# torch_impl.fsdp, DCP's in torch_impl.sharded_ckpt). Named as strings, not imported here:
# the launcher depends on none of them (tests/test_layout.py reads its imports), and a job
# naming a runner not listed still runs, importing it in each rank.
PRELOAD = ("torch", "torch._dynamo", "ranks.launcher", "ranks.faults", "torch_impl.ddp_jobs",
           "torch_impl.ddp_scaler", "torch_impl.fsdp", "torch_impl.sharded_ckpt",
           "torch_impl.ddp_train", "torch_impl.fsdp_gpt")


class DDPError(RuntimeError):
    """A launch failed: which rank, how, and what it said."""


def launch(jobs: list[dict[str, Any]], world_size: int, timeout: float = 60.0,
           collective_timeout: float = 30.0, backend: str = "gloo"
           ) -> list[list[dict[str, Any]]]:
    """results[rank][job] of running `jobs` on world_size processes.

    The launch ends when every rank has exited 0, or at the first rank that fails: a rank
    that raised (its traceback's last line), died of a signal, or a launch still running
    after `timeout` seconds; then every rank still running is killed and DDPError says
    which rank failed and how. Collectives time out after `collective_timeout` seconds
    (init_process_group's timeout), so a hung peer ends its partners' waits too.
    `backend` "nccl": rank r on cuda:r (one GPU per rank).
    """
    if backend not in BACKENDS:
        raise ValueError(f"launch: backend must be 'gloo' or 'nccl', got {backend!r}")
    if world_size < 1 or any(j["world_size"] > world_size for j in jobs):
        raise ValueError(f"launch: world_size {world_size} must be >= 1 and >= every job's")
    if any("runner" not in j for j in jobs):
        raise ValueError("launch: every job names its runner module (job['runner'])")
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
    """forkserver, its server preloaded with PRELOAD: each rank is then a fork of a clean
    single-threaded process (no OpenMP pool, no CUDA), and pays no import; the server
    starts once per parent process."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def _wait(procs: list, tmp: Path, timeout: float) -> None:
    """Until all exit 0; DDPError at the first failure or at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.exitcode for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        running = [r for r, c in enumerate(codes) if c is None]
        # a rank that failed at the teardown barrier only waited for a peer: while a peer
        # still runs its job, wait for that peer's own failure (the culprit) or the deadline
        waiting = running and all(_errors(tmp, [r]) and _errors(tmp, [r])[0][1] == TEARDOWN
                                  for r in failed)
        if failed and not (waiting and time.monotonic() <= deadline):
            raise DDPError(_failure(failed, codes, tmp, running))
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            raise DDPError(f"ddp: ranks {running} still running after {timeout:g} s "
                           "(a hung peer?): killed")
        time.sleep(0.02)


def _failure(failed: list[int], codes: list, tmp: Path, running: list[int]) -> str:
    """The culprit: a rank killed by a signal, else the rank whose error came first."""
    still = f"; ranks {running} were still running and are killed" if running else ""
    for r in failed:
        if codes[r] < 0:
            return f"ddp: rank {r} was killed by {signal.Signals(-codes[r]).name}{still}"
    errors = _errors(tmp, failed)
    if not errors:
        return f"ddp: rank {failed[0]} exited with code {codes[failed[0]]}{still}"
    job_errors = [e for e in errors if e[1] != TEARDOWN] or errors  # a job's error first
    _, _, r, message = min(job_errors)
    return f"ddp: rank {r} failed: {message}{still}"


TEARDOWN = "teardown"  # a rank's error at the barrier every rank meets before leaving


def _errors(tmp: Path, failed: list[int]) -> list[tuple[float, str, int, str]]:
    """(time, stage, rank, last line) of each failed rank's rank<r>.err that exists."""
    errors = []
    for r in failed:
        path = tmp / f"rank{r}.err"
        if path.exists():
            when, stage, message = path.read_text(encoding="utf-8").split("\n", 2)
            errors.append((float(when), stage, r, message.strip()))
    return errors


def _worker(rank: int, world_size: int, tmp: str, jobs: list[dict[str, Any]],
            collective_timeout: float, backend: str) -> None:
    """One rank: rendezvous, run the jobs, save the results; on an error write its time, the
    stage (the job, or the teardown barrier) and the last line to rank<r>.err and exit 1."""
    stage = "job"
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
            run = importlib.import_module(job["runner"]).run
            results.append(run(job, rank, groups[w]))
        torch.save(results, os.path.join(tmp, f"rank{rank}.pt"))
        # every rank reaches the teardown together: a rank that destroyed its group while a
        # peer still held it once left that peer waiting in destroy_process_group for good
        # (torch 2.6, under load, in a 3-rank train), where no collective timeout applies
        stage = TEARDOWN
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as error:  # reported to the parent, then exit 1
        last = traceback.format_exception_only(type(error), error)[-1].strip()
        Path(tmp, f"rank{rank}.err").write_text(f"{time.time()!r}\n{stage}\n{last}\n",
                                                encoding="utf-8")
        os._exit(1)
