"""Ranks: N processes on this machine joined by torch.distributed, each running a list of
jobs. Not half of a twin: the plumbing that lets torch_impl's distributed twins run (the
reference simulates its ranks in one process and needs none of it).

`launch(jobs, world_size)` (ranks/launcher.py) starts the processes, runs every job on
every rank and returns what each rank recorded; a failing rank ends the launch with
DDPError. A job is a dict naming the module whose `run(job, rank, group)` runs it
(job["runner"]), so the launcher knows no kind of job. `fault_job` (ranks/faults.py) is
the launcher's own job: a rank that raises, is SIGKILLed or hangs.

Imports: torch and the standard library only (tests/test_layout.py), never reference/,
torch_impl/ or parity/, which import it.
"""

from ranks.faults import fault_job
from ranks.launcher import DDPError, launch

__all__ = ["DDPError", "fault_job", "launch"]
