"""Uneven shards after a world-size change (a peer's bug: the loss differed after a resume
under uneven sharding). A data-parallel loop over simulated ranks is checkpointed on 2 ranks
and comes back on 3; the dataset's 14 rows do not divide by 3. What is trained on stands
for the model: `seen`, how many times each row was in a global batch.

The faulty loop shards as torch's DistributedSampler does (rank r takes rows r::N of the
epoch's order, the order padded with its first rows to a multiple of N) and saves the rows
each rank has consumed this epoch, which a resume at another N applies to other shards:
rows are dropped, and the padding repeats others.

The repaired loop follows the project's rule (NOTE [ Resharding a DDP checkpoint ] in
torch_impl/sharded_ckpt.py, reference/data.py's sampler): the position is GLOBAL, the
(epoch, position) of one sampler over the whole dataset; every step takes the next global
batch of B = 6 rows and rank r trains on rows r::N of it (reference.ddp.shard); B must
split evenly at every N (the train command refuses an N that does not divide it), the
dataset's size need not: the n mod B rows past an epoch's last whole batch are left out of
that epoch (drop_last) by every run alike. A resume at any N' then takes the uninterrupted
run's global batches: no row dropped, none repeated.

    cd examples/peers && python -m parity resume-check uneven_shards:faulty --steps 6 --at 4
    cd examples/peers && python -m parity resume-check uneven_shards:repaired --steps 6 --at 4

The first prints `resume-check: differs: first entry seen, the runs part at step 5 at
seen` (tests/test_resume_check_peers.py), and the second `resume-check: exact`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DistributedSampler

from reference.data import BatchSampler, ResumableSampler

ROWS, BATCH, SEED = 14, 6, 0
SAVED_ON, RESUMED_ON = 2, 3  # ranks before the checkpoint, and after the restart


class Trainer:
    """Simulated data-parallel ranks consuming rows: `ranks` is range(SAVED_ON) until a
    load, range(RESUMED_ON) after it (the job restarted on more machines)."""

    def __init__(self, global_position: bool) -> None:
        self.global_position = global_position
        self.ranks = range(SAVED_ON)
        self.seen = torch.zeros(ROWS, dtype=torch.int64)  # (rows,) times in a global batch
        self.sampler = ResumableSampler(ROWS, SEED)  # the repair's: one, global
        self.batches: Iterator[list[int]] | None = None
        self.epoch = self.position = 0  # the faulty loop's: rows each rank took this epoch

    def _shards(self) -> list[list[int]]:
        """DistributedSampler's shard of every rank this epoch (padded to a multiple of N)."""
        out = []
        for rank in self.ranks:
            s = DistributedSampler(range(ROWS), num_replicas=len(self.ranks), rank=rank,
                                   shuffle=True, seed=SEED)
            s.set_epoch(self.epoch)
            out.append(list(s))
        return out

    def _global_batches(self) -> Iterator[list[int]]:
        while True:  # epoch after epoch, from the sampler's (restored) position
            yield from BatchSampler(self.sampler, BATCH, drop_last=True)

    def step(self) -> None:
        ws = len(self.ranks)
        per_rank = BATCH // ws
        if self.global_position:
            if self.batches is None:
                self.batches = self._global_batches()
            batch = next(self.batches)
            rows = list(itertools.chain(*(batch[r::ws] for r in self.ranks)))
        else:
            shards = self._shards()
            if self.position >= len(shards[0]):  # this epoch's shards are used up
                self.epoch, self.position = self.epoch + 1, 0
                shards = self._shards()
            rows = [i for s in shards for i in s[self.position:self.position + per_rank]]
            self.position += per_rank
        self.seen[rows] += 1

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"seen": self.seen.clone()}
        if self.global_position:
            state["sampler"] = self.sampler.state_dict()
        else:  # BUG: a count of each rank's own rows, which another N shards otherwise
            state["data"] = {"epoch": self.epoch, "position": self.position}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ranks = range(RESUMED_ON)
        self.seen = state["seen"].clone()
        if self.global_position:
            self.sampler.load_state_dict(state["sampler"])
        else:
            self.epoch, self.position = state["data"]["epoch"], state["data"]["position"]


def faulty() -> Trainer:
    return Trainer(global_position=False)


def repaired() -> Trainer:
    return Trainer(global_position=True)
