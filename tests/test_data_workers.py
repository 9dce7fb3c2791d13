"""torch_impl/data_workers.py: with worker processes the state is the consumed position and a
batch's randomness is a function of where the batch sits (NOTE [ Consumed position ] in
reference/data.py). Oracles: make_loader with num_workers=0 (one batch fetched per batch
consumed) and the DataLoader's own prefetch counter.

CPU only: a worker process cannot index a dataset of CUDA tensors, and the prefetch is the
DataLoader's, not the device's. Every test ends the worker processes it started (close()).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from torch_impl import data
from torch_impl.data_workers import WorkerLoader

N, B, SEED = 50, 4, 3  # 12 full batches an epoch and a tail of 2


def _noise(batch: tuple[torch.Tensor, ...], g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """A test augmentation: inputs plus uniform noise drawn from the batch's generator."""
    x, labels, values = batch
    return x + torch.rand(x.shape, generator=g, dtype=x.dtype), labels, values


@contextmanager
def loader(workers: int, sampler: data.ResumableSampler | None = None, drop_last: bool = True,
           augment: object = None) -> Iterator[WorkerLoader]:
    """A WorkerLoader over the teacher task whose worker processes end with the block."""
    s = data.ResumableSampler(N, SEED) if sampler is None else sampler
    w = WorkerLoader(data.make_task(SEED, N), s, B, drop_last=drop_last, num_workers=workers,
                     generator=torch.Generator().manual_seed(0), augment=augment,  # type: ignore[arg-type]
                     timeout_s=60.0)
    try:
        yield w
    finally:
        w.close()


def _take(w: WorkerLoader, count: int) -> list[tuple[torch.Tensor, ...]]:
    """`count` batches, calling iter() again at each epoch end as a training loop does."""
    out: list[tuple[torch.Tensor, ...]] = []
    while len(out) < count:
        for batch in w:
            out.append(batch)
            if len(out) == count:
                break
    return out


def _plain(count: int, drop_last: bool) -> list[tuple[torch.Tensor, ...]]:
    """The oracle: make_loader (num_workers=0), the same count of batches."""
    s = data.ResumableSampler(N, SEED)
    plain = data.make_loader(data.make_task(SEED, N), s, B, drop_last=drop_last,
                             generator=torch.Generator().manual_seed(0))
    out: list[tuple[torch.Tensor, ...]] = []
    while len(out) < count:
        for batch in plain:
            out.append(batch)
            if len(out) == count:
                break
    return out


def _equal(a: list[tuple[torch.Tensor, ...]], b: list[tuple[torch.Tensor, ...]]) -> bool:
    return len(a) == len(b) and all(torch.equal(u, v) for p, q in zip(a, b, strict=True)
                                    for u, v in zip(p, q, strict=True))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("drop_last", [True, False])
def test_worker_loader_yields_make_loaders_batches_bit_for_bit(workers: int, drop_last: bool
                                                               ) -> None:
    """Across three epochs, with and without the short tail: the batches of num_workers=0."""
    count = 3 * (N // B + (not drop_last))
    with loader(workers, drop_last=drop_last) as w:
        assert _equal(_take(w, count), _plain(count, drop_last))


def test_the_state_counts_consumed_batches_while_the_workers_run_ahead() -> None:
    """After k batches reach the loop the state is position k*B, though the DataLoader has
    sent more batches to its workers (guard: it has)."""
    s = data.ResumableSampler(N, SEED)
    with loader(2, s) as w:
        it = iter(w)
        for k in range(1, 4):
            next(it)
            assert (s.epoch, s.position) == (0, k * B)
        assert w._live is not None and w._live._send_idx > 3  # prefetched past the consumed


@pytest.mark.parametrize("stop", [5, 12, 13, 30])  # mid-epoch, at the tail, just after it
def test_a_resumed_worker_loader_fetches_from_the_consumed_position(stop: int) -> None:
    """`stop` batches with 2 workers, the state through JSON into a fresh 2-worker loader,
    the rest: the uninterrupted stream (nothing prefetched is skipped or repeated)."""
    total = 40
    with loader(2) as w:
        head = _take(w, stop)
        state = json.loads(json.dumps(w.sampler.state_dict()))
    s = data.ResumableSampler(N, SEED)
    s.load_state_dict(state)
    with loader(2, s) as w:
        tail = _take(w, total - stop)
    assert _equal(head + tail, _plain(total, drop_last=True))


def test_augmentation_draws_depend_on_the_batch_not_on_the_worker_or_a_resume() -> None:
    """A batch's noise comes from batch_seed(seed, epoch, batch index): equal with 0 and 2
    workers and after a resume at batch 7; and it is really drawn (guards: the batches differ
    from unaugmented ones, and batch k of two epochs gets different noise)."""
    total, stop = 30, 7
    with loader(0, augment=_noise) as w:
        zero = _take(w, total)
    with loader(2, augment=_noise) as w:
        head = _take(w, stop)
        state = w.sampler.state_dict()
    s = data.ResumableSampler(N, SEED)
    s.load_state_dict(state)
    with loader(2, s, augment=_noise) as w:
        tail = _take(w, total - stop)
    assert _equal(head + tail, zero)
    plain = _plain(total, drop_last=True)
    assert not any(torch.equal(a[0], p[0]) for a, p in zip(zero, plain, strict=True))
    noise = [a[0] - p[0] for a, p in zip(zero, plain, strict=True)]
    assert not any(torch.equal(noise[k], noise[k + 12]) for k in range(12))  # epoch in the seed


def test_close_ends_the_worker_processes() -> None:
    """close() on a live iterator ends its workers; the next iter() starts fresh ones."""
    with loader(2) as w:
        it = iter(w)
        next(it)
        processes = list(w._live._workers)  # type: ignore[union-attr]
        assert len(processes) == 2 and all(p.is_alive() for p in processes)
        w.close()
        for p in processes:
            p.join(timeout=30)
        assert not any(p.is_alive() for p in processes)
        assert w._live is None


@pytest.mark.parametrize(("kwargs", "error", "phrase"), [
    ({"num_workers": -1}, ValueError, "num_workers=-1 is outside"),
    ({"num_workers": 2, "generator": None}, TypeError, "generator must be a torch.Generator"),
    ({"num_workers": 2, "batch_size": 0}, ValueError, "batch_size=0 is outside"),
])
def test_bad_worker_loader_arguments_are_one_clear_error(kwargs: dict, error: type,
                                                         phrase: str) -> None:
    """A negative worker count, no generator, an empty batch: refused, saying which."""
    args = {"batch_size": B, "generator": torch.Generator(), **kwargs}
    with pytest.raises(error, match=phrase):
        WorkerLoader(data.make_task(SEED, N), data.ResumableSampler(N, SEED), **args)


def test_a_run_with_loader_workers_resumes_to_the_digest_of_zero_workers() -> None:
    """torch_impl.train.Run with 2 loader workers, checkpointed at step 21 (epoch 1, batch
    5, while the workers had fetched batches ahead) and restored into a fresh 2-worker Run:
    at step 30 the state digest of an uninterrupted run with 0 workers."""
    from torch_impl import train as t

    config = t.TrainConfig(horizon=30, dropout=0.1)  # 16 batches an epoch
    zero = t.Run(config)
    for _ in range(30):
        zero.train_step()
    first = t.Run(config, loader_workers=2)
    try:
        for _ in range(21):
            first.train_step()
        state = first.state_dict()
        assert (state["data"]["epoch"], state["data"]["position"]) == (1, 5 * config.batch_size)
    finally:
        first.close()
    second = t.Run.restored(config, state, loader_workers=2)
    try:
        for _ in range(9):
            second.train_step()
    finally:
        second.close()
    assert t.state_digest(second.state_dict()) == t.state_digest(zero.state_dict())
