"""The launcher's own job: one rank fails on purpose (raises, is SIGKILLed, or hangs) before
an all_reduce its peers wait in; tests/test_ddp_launch.py holds launch's failure handling
to it."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist

HOWS = ("raise", "kill", "hang")


def fault_job(rank: int, how: str, world_size: int) -> dict[str, Any]:
    """Rank `rank` raises ("raise"), SIGKILLs itself ("kill") or hangs ("hang") before an
    all_reduce the others wait in."""
    if how not in HOWS:
        raise ValueError(f"fault_job: how must be 'raise', 'kill' or 'hang', got {how!r}")
    return {"kind": "fault", "runner": __name__, "rank": rank, "how": how,
            "world_size": world_size}


def run(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """The fault on its rank; every other rank all-reduces ones and waits for it."""
    if rank == job["rank"]:
        if job["how"] == "raise":
            raise ValueError(f"rank {rank} raises on purpose (fault_job)")
        if job["how"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3600)  # "hang": the others wait in all_reduce until their timeout
    t = torch.ones(4)
    dist.all_reduce(t, group=group)
    return {"output": t}
