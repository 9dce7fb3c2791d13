"""A DataLoader with worker processes whose checkpoint is still exact (see torch_impl/data.py).

The order is the sampler's (reference/data.py); what worker processes change is WHEN
indices are drawn (NOTE [ Workers run ahead of the sampler state ] in torch_impl/data.py).
`WorkerLoader` keeps the rule of NOTE [ Consumed position ] (reference/data.py):

- each iter() builds a DataLoader over a COPY of the run's sampler, positioned where the
  run's sampler stands: the consumed position. The workers prefetch from the copy; a
  resumed loader therefore starts fetching at the checkpoint's position, and a prefetched
  batch that was never consumed is fetched again after a resume, not skipped.
- every batch the loop receives carries the copy's state right after its indices were
  drawn; the run's sampler is set to it then, so state_dict() counts consumed batches.
  When the epoch's batches are used up, the run's sampler takes the copy's final state
  (the next epoch, position 0; with drop_last the dropped tail is passed over).
- a batch is fetched as one item (batch_size=None, `BatchKey` in, the collated batch out),
  and `augment(batch, generator)` draws from a torch.Generator seeded with
  batch_seed(seed, epoch, batch index) in whichever process fetches it: the same draws for
  any number of workers, with or without a resume. The workers' own seeds (the DataLoader's
  base seed + worker id) are never used.

The batches equal make_loader's (num_workers=0) bit for bit: the same indices, gathered by
the same Task.batch. A live iterator holds worker processes; `close()` ends them (they end
too when an epoch's iterator is used up, and with their parent process).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from common.arg_ranges import WORKER_BATCH_SIZES, WORKER_COUNTS
from torch_impl.data import ResumableSampler, SequenceTask, Task, _check_int, batch_seed

Augment = Callable[[tuple[torch.Tensor, ...], torch.Generator], tuple[torch.Tensor, ...]]
TIMEOUT_S = 120.0  # a worker silent this long raises in the loop instead of hanging it

__all__ = ["TIMEOUT_S", "BatchKey", "WorkerLoader"]


@dataclass(frozen=True)
class BatchKey:
    """One batch as the workers see it: where it sits, its indices, the state after it."""

    epoch: int
    batch: int  # index of the batch in its epoch: position // batch_size at its first sample
    indices: tuple[int, ...]
    after: dict[str, int]  # the sampler's state_dict() once these indices are drawn


class _Keys(Sampler[BatchKey]):
    """The batches of the copy sampler's current epoch, as BatchKeys (main process)."""

    def __init__(self, sampler: ResumableSampler, batch_size: int, drop_last: bool) -> None:
        super().__init__()
        self.sampler, self.batch_size = sampler, batch_size
        self.batches = BatchSampler(sampler, batch_size, drop_last)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[BatchKey]:
        epoch, start = self.sampler.epoch, self.sampler.position
        for k, indices in enumerate(self.batches):
            yield BatchKey(epoch, start // self.batch_size + k, tuple(indices),
                           self.sampler.state_dict())


class _Fetch(Dataset):
    """key -> (key.after, the batch, augmented): what a worker computes for one BatchKey."""

    def __init__(self, task: Task | SequenceTask, seed: int, augment: Augment | None) -> None:
        self.task, self.seed, self.augment = task, seed, augment

    def __getitem__(self, key: BatchKey) -> tuple[dict[str, int], tuple[torch.Tensor, ...]]:
        batch = self.task.batch(key.indices)
        if self.augment is not None:
            g = torch.Generator().manual_seed(batch_seed(self.seed, key.epoch, key.batch))
            batch = self.augment(batch, g)
        return key.after, batch


class WorkerLoader:
    """Batches of `task` in `sampler`'s order, fetched by `num_workers` processes (0: in
    this one); `sampler` always stands at the consumed position (module docstring)."""

    def __init__(self, task: Task | SequenceTask, sampler: ResumableSampler, batch_size: int,
                 *, drop_last: bool = False, generator: torch.Generator, num_workers: int,
                 augment: Augment | None = None, timeout_s: float = TIMEOUT_S) -> None:
        if sampler.num_samples != len(task):
            raise ValueError(f"WorkerLoader: sampler has num_samples={sampler.num_samples}, "
                             f"task has {len(task)} samples")
        if not isinstance(generator, torch.Generator):
            raise TypeError("WorkerLoader: generator must be a torch.Generator (NOTE [ "
                            f"DataLoader base seed ]), got {type(generator).__name__}")
        self.num_workers = _check_int("WorkerLoader", "num_workers", num_workers,
                                      WORKER_COUNTS)
        self.batch_size = _check_int("WorkerLoader", "batch_size", batch_size,
                                     WORKER_BATCH_SIZES)
        if num_workers and task.inputs.device.type != "cpu":
            raise ValueError(f"WorkerLoader: num_workers={num_workers} needs the task on the "
                             f"cpu (it is on {task.inputs.device}): a worker process cannot "
                             "index CUDA tensors")
        self.task, self.sampler, self.drop_last = task, sampler, bool(drop_last)
        self.generator, self.augment, self.timeout_s = generator, augment, float(timeout_s)
        self.dataset = task
        self._live: Iterator | None = None

    def __len__(self) -> int:
        return len(BatchSampler(self.sampler, self.batch_size, self.drop_last))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        self.close()
        fetch = ResumableSampler(self.sampler.num_samples, self.sampler.seed)
        fetch.load_state_dict(self.sampler.state_dict())  # prefetch from the consumed position
        loader = DataLoader(_Fetch(self.task, self.sampler.seed, self.augment),
                            sampler=_Keys(fetch, self.batch_size, self.drop_last),
                            batch_size=None, num_workers=self.num_workers,
                            generator=self.generator,
                            timeout=self.timeout_s if self.num_workers else 0)
        return self._consume(loader, fetch)

    def _consume(self, loader: DataLoader, fetch: ResumableSampler
                 ) -> Iterator[tuple[torch.Tensor, ...]]:
        live = self._live = iter(loader)
        for after, batch in live:
            self.sampler.load_state_dict(after)  # this batch is consumed now
            yield batch
        self.sampler.load_state_dict(fetch.state_dict())  # the epoch is used up
        self._live = None

    def close(self) -> None:
        """End the worker processes of a live iterator (nothing when none is live)."""
        live, self._live = self._live, None
        shutdown = getattr(live, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
