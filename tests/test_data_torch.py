"""torch_impl/data.py against its own oracles: Python-int hashing, DataLoader behaviour.

Tests whose claim should hold on CUDA take the --device (the hash, the orders and the task
are computed there); the sampler's state and the DataLoader's own machinery are CPU-side
Python and are tested once."""

from __future__ import annotations

import io
import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from torch_impl import data

M32 = 2**32


def mix32_int(x: int) -> int:
    """lowbias32 on a Python int (the formula of reference/data.py's docstring)."""
    x ^= x >> 16
    x = x * data.MIX_MUL1 % M32
    x ^= x >> 15
    x = x * data.MIX_MUL2 % M32
    return x ^ (x >> 16)


@given(xs=st.lists(st.integers(0, M32 - 1), min_size=1, max_size=50))
def test_mix32_split_int64_product_matches_python_int_formula(xs: list[int], device: str
                                                             ) -> None:
    """The int64 split multiply (two 32x16-bit products) is x * c mod 2^32 exactly."""
    assert data.mix32(torch.tensor(xs, device=device)).tolist() == [mix32_int(x) for x in xs]


@given(seed=st.integers(0, M32 - 1), epoch=st.integers(0, M32 - 1), n=st.integers(1, 500))
def test_epoch_order_is_a_deterministic_permutation_sorted_by_hashed_words(
    seed: int, epoch: int, n: int, device: str
) -> None:
    """Each epoch is a permutation of 0..n-1, ascending in its (distinct) words."""
    order = data.epoch_order(seed, epoch, n, device)
    assert order.dtype == torch.int64
    assert torch.equal(torch.sort(order).values, torch.arange(n, device=device))
    words = data.hash_words(seed, data.ORDER, epoch, n, device)[order]
    assert bool(torch.all(words.diff() > 0))
    assert torch.equal(order, data.epoch_order(seed, epoch, n, device))


def test_different_epochs_and_seeds_give_different_orders(device: str) -> None:
    """Over 5 seeds x 5 epochs, the 25 orders of 64 samples are pairwise different."""
    orders = {tuple(data.epoch_order(s, e, 64, device).tolist())
              for s in range(5) for e in range(5)}
    assert len(orders) == 25


def test_task_on_device_is_bit_identical_to_cpu(device: str) -> None:
    """make_task on --device gives the CPU bits (exact arithmetic has no device rounding)."""
    if device == "cpu":
        pytest.skip("compares a device against cpu: run with --device cuda")
    a = data.make_task(3, 500, dtype=torch.float64)
    b = data.make_task(3, 500, dtype=torch.float64, device=device)
    for x, y in ((a.inputs, b.inputs), (a.labels, b.labels), (a.values, b.values)):
        assert torch.equal(x, y.cpu())


def test_task_is_a_dataset_whose_items_and_batches_agree(device: str) -> None:
    """task[i] is row i of (inputs, labels, values); batch(indices) stacks the same rows."""
    task = data.make_task(1, 50, device=device)
    assert len(task) == 50 and task.labels.dtype == torch.int64
    x, y, v = task.batch([7, 3])
    assert torch.equal(x[1], task[3][0]) and int(y[0]) == int(task[7][1])
    assert torch.equal(v[0], task[7][2])


# ---------------------------------------------------------------- DataLoader


def test_sampler_and_batch_sampler_forms_of_dataloader_give_the_same_batches(device: str
                                                                            ) -> None:
    """DataLoader(sampler=s, batch_size=B) and make_loader (batch_sampler=) yield equal batches."""
    task = data.make_task(2, 23, device=device)
    for drop_last in (False, True):
        s1, s2 = data.ResumableSampler(23, 2), data.ResumableSampler(23, 2)
        g = torch.Generator().manual_seed(0)
        plain = DataLoader(task, sampler=s1, batch_size=5, drop_last=drop_last, generator=g)
        made = data.make_loader(task, s2, 5, drop_last=drop_last, generator=g)
        a, b = list(plain), list(made)
        assert len(a) == len(b) == (4 if drop_last else 5)
        assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b, strict=True))
        assert s1.state_dict() == s2.state_dict() == {"seed": 2, "num_samples": 23,
                                                      "epoch": 1, "position": 0}


def test_dataloader_resumes_mid_epoch_from_a_state_saved_with_torch_save(device: str) -> None:
    """Break after 3 batches, torch.save/load(weights_only) the state: the rest of the epoch."""
    task = data.make_task(4, 40, device=device)
    whole = list(data.make_loader(task, data.ResumableSampler(40, 4), 6,
                                  generator=torch.Generator()))
    s1 = data.ResumableSampler(40, 4)
    head = list(itertools.islice(data.make_loader(task, s1, 6, generator=torch.Generator()), 3))
    buf = io.BytesIO()
    torch.save(s1.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert state == {"seed": 4, "num_samples": 40, "epoch": 0, "position": 18}
    s2 = data.ResumableSampler(40, 4)
    s2.load_state_dict(state)
    tail = list(data.make_loader(task, s2, 6, generator=torch.Generator()))
    assert len(head) + len(tail) == len(whole) == 7
    assert all(torch.equal(x[0], y[0]) for x, y in zip(head + tail, whole, strict=True))


def test_iter_dataloader_without_generator_advances_the_global_rng() -> None:
    """NOTE [ DataLoader base seed ]: iter(loader) draws from the global RNG unless given one."""
    task = data.make_task(0, 8)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(123)
        before = torch.get_rng_state()
        iter(DataLoader(task, sampler=data.ResumableSampler(8, 0), batch_size=2))
        assert not torch.equal(before, torch.get_rng_state())  # the trap

        torch.manual_seed(123)
        before = torch.get_rng_state()
        g = torch.Generator().manual_seed(5)
        g_before = g.get_state()
        iter(data.make_loader(task, data.ResumableSampler(8, 0), 2, generator=g))
        assert torch.equal(before, torch.get_rng_state())  # global stream untouched
        assert not torch.equal(g_before, g.get_state())  # the draw went to the loader's own


def test_make_loader_requires_a_generator_and_a_matching_sampler() -> None:
    """No generator, or a sampler over another length, is refused with a clear error."""
    task = data.make_task(0, 8)
    with pytest.raises(TypeError, match=r"generator must be a torch\.Generator"):
        data.make_loader(task, data.ResumableSampler(8, 0), 2, generator=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_samples=9"):
        data.make_loader(task, data.ResumableSampler(9, 0), 2, generator=torch.Generator())


def test_worker_prefetch_runs_the_sampler_state_ahead_of_consumption() -> None:
    """NOTE [ Workers run ahead ]: with num_workers=1 the state counts prefetched batches too.

    CPU only: a worker process cannot index a dataset of CUDA tensors (CUDA does not survive
    fork), and the prefetch is the DataLoader's, not the device's."""
    task = data.make_task(0, 100)
    s = data.ResumableSampler(100, 0)
    loader = DataLoader(task, sampler=s, batch_size=5, num_workers=1,
                        generator=torch.Generator().manual_seed(0))
    it = iter(loader)
    next(it)
    consumed = 5
    assert s.position > consumed  # (1 + prefetch_factor * num_workers) * 5 = 15 in torch 2.x
    del it


# ---------------------------------------------------------------- state


BAD_STATES = [
    ({"epoch": 0, "position": 0, "seed": 1}, ValueError, r"missing keys \['num_samples'\]"),
    ({"seed": 1, "num_samples": 10, "epoch": 0, "position": 0, "rng": 3}, ValueError,
     r"unexpected keys \['rng'\]"),
    ({"seed": 1, "num_samples": 10, "epoch": 0, "position": 10}, ValueError, "position=10"),
    ({"seed": 1, "num_samples": 11, "epoch": 0, "position": 0}, ValueError,
     "different dataset length"),
    ({"seed": 2, "num_samples": 10, "epoch": 0, "position": 0}, ValueError, "seed=2"),
    ({"seed": 1, "num_samples": 10, "epoch": 0, "position": torch.tensor(2.0)}, TypeError,
     "position must"),
]


@pytest.mark.parametrize(("state", "error", "match"), BAD_STATES)
def test_load_state_dict_rejects_bad_state_and_keeps_the_old_one(
    state: dict, error: type, match: str
) -> None:
    """Wrong keys, out-of-range values, another length or seed: a clear error, state unchanged."""
    s = data.ResumableSampler(10, seed=1)
    s.load_state_dict({"seed": 1, "num_samples": 10, "epoch": 3, "position": 4})
    with pytest.raises(error, match=match):
        s.load_state_dict(state)
    assert (s.epoch, s.position) == (3, 4)


def test_live_iterator_raises_when_state_is_loaded_under_it() -> None:
    """A load_state_dict during iteration makes the old iterator raise, not silently mix."""
    s = data.ResumableSampler(10, seed=1)
    it = iter(s)
    next(it)
    s.load_state_dict({"seed": 1, "num_samples": 10, "epoch": 5, "position": 2})
    with pytest.raises(RuntimeError, match="state changed under a live iterator"):
        next(it)
    assert next(iter(s)) == int(s.order(5)[2])
