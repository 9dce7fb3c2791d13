"""Sharded checkpoints that cannot tear, for simulated ranks: one container per rank
(reference/resume.py's "npy-records" payload, written by the atomic write) in a fresh step
directory, committed by a record (NOTE [ A checkpoint exists when its commit record does ]
in ckpt/commit.py):

    parent/step-<step>/rank-<r>.ckpt     rank r's whole state, a flat dict of arrays
    parent/step-<step>/config.json       the run's configuration, if given (train --world-size)
    parent/COMMITTED-<step>.json         step, world size, payload, each file's size, SHA-256

save_sharded:
    make step-<step> (it must not exist)
    for each rank r: write rank-<r>.ckpt atomically (fsync, rename, fsync the directory),
                     record its size and SHA-256
    commit: fsync the step directory, write COMMITTED-<step>.json atomically
load_sharded:
    the newest record of this payload whose every file verifies (size, SHA-256), then read
    its ranks' containers (each again verified by its own XXH3-128 seal)

The state's keys are the torch twin's (torch_impl/sharded_ckpt.py's table: model/<name>,
optim/momentum/<i> or the GPT's optim/step|exp_avg|exp_avg_sq/<i>, optim/lr and sched/...,
scaler/..., data/..., step, rng/rank<r>), so the two trees' states map
key for key; their payloads do not: the twin's files are DCP's (torch serialization and a
pickled .metadata), which the reference never reads (NOTE [ No pickle on load ] in
reference/resume.py), and the reference's containers are not DCP's. Each tree therefore
resumes its own sharded checkpoints and refuses the other's by the record's payload.

Resharding follows NOTE [ Resharding a DDP checkpoint ] in torch_impl/sharded_ckpt.py: a
different world size takes the replicated entries from rank 0's file and re-derives every
rank's stream from ckpt.commit.rank_seed(seed, rank, step) (here a NumPy PCG64 seeded by it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ckpt import commit as ckc
from reference import resume

PAYLOAD = resume.PAYLOAD  # "npy-records"


def save_sharded(parent: str | os.PathLike, step: int, states: Sequence[Mapping[str, Any]],
                 config: dict[str, Any] | None = None) -> Path:
    """Write every simulated rank's state (states[r]) and commit; returns the step
    directory. CheckpointDirectoryError if step-<step> exists. `config`: the run's
    configuration, as config.json listed in the record (ckpt.commit.write_config)."""
    if not states:
        raise ValueError("save_sharded: at least one rank's state")
    directory = ckc.make_fresh(parent, step)
    entries = []
    for r, state in enumerate(states):  # on the engine each rank writes its own, at once
        name = f"rank-{r}.ckpt"
        resume.save_checkpoint(directory / name, state)
        entries.append(ckc.file_entry(directory, name))
    if config is not None:
        entries.append(ckc.write_config(directory, config))
    ckc.commit(parent, step, len(states), PAYLOAD, entries)
    return directory


def rank_stream(seed: int, rank: int, step: int) -> dict[str, Any]:
    """The re-derived stream of `rank` at `step`: a PCG64 state seeded by rank_seed."""
    return np.random.default_rng(ckc.rank_seed(seed, rank, step)).bit_generator.state


def load_sharded(parent: str | os.PathLike, world_size: int, seed: int
                 ) -> tuple[ckc.Commit, list[dict[str, Any]]]:
    """The newest verified commit's states for `world_size` ranks: its own ranks' at the
    same world size, else rank 0's replicated entries with streams re-derived."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"load_sharded: world_size must be an int >= 1, got {world_size!r}")
    record, _ = ckc.newest(parent, PAYLOAD)
    names = {f.name for f in record.files} - {ckc.CONFIG}
    expected = {f"rank-{r}.ckpt" for r in range(record.world_size)}
    if names != expected:
        raise resume.CheckpointCorruptError(f"commit record {record.path}: files {sorted(names)}"
                                            f", expected {sorted(expected)}")
    if world_size == record.world_size:
        return record, [resume.load_checkpoint(record.directory / f"rank-{r}.ckpt")
                        for r in range(world_size)]
    saved = resume.load_checkpoint(record.directory / "rank-0.ckpt")
    replicated = {k: v for k, v in saved.items() if not k.startswith("rng/")}
    step = int(np.asarray(saved["step"]))
    return record, [{**replicated, f"rng/rank{r}": rank_stream(seed, r, step)}
                    for r in range(world_size)]
