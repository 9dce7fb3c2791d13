"""Sharded checkpoints of a DDP run (torch_impl/sharded_ckpt.py): the runs the claims
ddp.ckpt_* compare, in one launch of 3 gloo processes, and the kill launches.

The default launch (`measure`): an uninterrupted 2-rank run of STEPS steps; a 2-rank run of
SAVE_AT steps that saves every EVERY steps; and resumes from its newest commit (step
SAVE_AT) on 2 ranks (the same world size: compared with the uninterrupted run), on 3 and on
1 (resharded: compared with the saved state and the re-derivation rule). A kill launch
(`kill`) is the saving run with one rank SIGKILLed at one point of the step-SAVE_AT save.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.train_config import TrainConfig
from common.train_loop import RanksResult

SIZES = (8, 64, 64, 3)
STEPS = 6
EVERY = 2
SAVE_AT = 4  # the newest commit the resumes start from
RESHARD = (3, 1)  # the world sizes a 2-rank checkpoint resumes on besides 2
# the kill points (torch_impl.sharded_ckpt.FAULTS) with their victim: rank 1 after its data
# (a rank that is not the coordinator), the coordinator before the metadata and before the
# commit record
KILLS = (("after_data", 1), ("before_metadata", 0), ("before_commit", 0))
# The train command's loop (torch_impl.ddp_train) resumed at 3 ranks, the fewest where DDP's
# bucket layout after a resume decides the ring's summation order (NOTE [ DDP's buckets
# after a resume ]): saved at step 2, resumed to step 3, whose reduction is not skipped
TRAIN_WORLD_SIZE, TRAIN_SAVE_AT, TRAIN_STEPS = 3, 2, 3


def config(seed: int = 0) -> TrainConfig:
    """fp16 with a GradScaler whose scale grows every 3 steps (its state changes between
    checkpoints, and the step-4 one holds growth tracker 1: a resume that drops it grows at
    step 7, not 6), 12 rows a global batch, 3 batches an epoch: the step-4 checkpoint is
    in epoch 1, mid-epoch (position 12 of 36), so both halves of the position are seen."""
    return TrainConfig(seed=seed, sizes=SIZES, precision="fp16", optimizer="SGD", lr=0.05,
                       schedule="constant", batch_size=12, num_samples=36,
                       growth_interval=3)


@dataclass
class Measured:
    """What the default launch recorded, per job: results[rank] of each run."""

    uninterrupted: list[dict[str, Any]]  # [rank], 2 ranks, no checkpoint
    saving: list[dict[str, Any]]  # [rank], 2 ranks, steps 1..SAVE_AT, saves every EVERY
    resumed: dict[int, list[dict[str, Any]]]  # {world size: [rank]}, from step SAVE_AT
    directory: Path  # the saving run's checkpoints


def _jobs(tmp: Path) -> list[dict]:
    from torch_impl import sharded_ckpt as sc

    c, saves = config(), str(tmp / "saves")
    return ([sc.ckpt_job(c, STEPS, 2, str(tmp / "none"), STEPS + 1),
             sc.ckpt_job(c, SAVE_AT, 2, saves, EVERY)]
            + [sc.ckpt_job(c, STEPS, w, saves, STEPS + 1, resume=True) for w in (2, *RESHARD)])


def measure(tmp: Path) -> Measured:
    """The default launch (3 processes); checkpoints under tmp."""
    import ranks

    jobs = _jobs(tmp)
    results = ranks.launch(jobs, 3, timeout=120.0)
    per_job = [[results[r][i] for r in range(j["world_size"])] for i, j in enumerate(jobs)]
    return Measured(per_job[0], per_job[1],
                    {j["world_size"]: per_job[i] for i, j in enumerate(jobs) if j["resume"]},
                    tmp / "saves")


def kill(tmp: Path, where: str, victim: int) -> str:
    """The saving run with `victim` SIGKILLed at `where` of the step-SAVE_AT save; returns
    the launch's error (DDPError: the launch must fail). Checkpoints in tmp/saves."""
    import ranks
    from torch_impl import sharded_ckpt as sc

    job = sc.ckpt_job(config(), SAVE_AT, 2, str(tmp / "saves"), EVERY,
                      fault=(where, victim, SAVE_AT))
    try:
        ranks.launch([job], 2, timeout=60.0, collective_timeout=10.0)
    except ranks.DDPError as e:
        return str(e)
    raise AssertionError(f"kill {where} on rank {victim}: the launch did not fail")


def resume(directory: Path, world_size: int) -> list[dict[str, Any]]:
    """A launch resuming `directory`'s newest commit to STEPS on world_size ranks."""
    import ranks
    from torch_impl import sharded_ckpt as sc

    job = sc.ckpt_job(config(), STEPS, world_size, str(directory), STEPS + 1, resume=True)
    return [r[0] for r in ranks.launch([job], world_size, timeout=60.0)]


def train_config(seed: int = 0) -> TrainConfig:
    """The train command's kind of run: fp16 (scale 2^17, growing every 3 steps: steps 1-3
    are not skipped), dropout drawn from every rank's own stream."""
    return TrainConfig(seed=seed, sizes=SIZES, precision="fp16", optimizer="SGD", lr=0.05,
                       schedule="constant", batch_size=12, num_samples=36,
                       growth_interval=3, init_scale=2.0**17, dropout=0.1)


def train_resume(tmp: Path) -> tuple[RanksResult, RanksResult, list[str]]:
    """(uninterrupted, resumed, the resumed run's step lines): torch_impl.ddp_train at
    TRAIN_WORLD_SIZE ranks to TRAIN_STEPS, and a run that saves at TRAIN_SAVE_AT resumed
    from that commit to TRAIN_STEPS (three launches)."""
    from ckpt import commit_policy
    from torch_impl import ddp_train

    c, ws, fresh = train_config(), TRAIN_WORLD_SIZE, commit_policy.Start(None, None)
    ignore: list[str] = []
    bounded = {"timeout": 120.0}  # a hung rank fails the test instead of stalling the run
    whole = ddp_train.train(c, TRAIN_STEPS, ws, tmp / "whole", TRAIN_STEPS, keep=2,
                            start=fresh, log=ignore.append, **bounded)
    ddp_train.train(c, TRAIN_SAVE_AT, ws, tmp / "saved", TRAIN_SAVE_AT, keep=2, start=fresh,
                    log=ignore.append, **bounded)
    start = commit_policy.start(tmp / "saved", ddp_train.PAYLOAD, resume=True,
                                overwrite=False, notify=ignore.append)
    lines: list[str] = []
    resumed = ddp_train.train(c, TRAIN_STEPS, ws, tmp / "saved", TRAIN_SAVE_AT, keep=2,
                              start=start, log=lines.append, **bounded)
    return whole, resumed, lines
