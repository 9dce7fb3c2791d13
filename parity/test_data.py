"""Parity of the data topic: the same task, the same order, the same resumed stream.

reference/data.py (NumPy) and torch_impl/data.py (torch) compute the task and the epoch
orders independently from one documented integer hash; each claim is in parity/tolerances.py.
"""

from __future__ import annotations

import json

import numpy as np
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.compare import assert_claim
from parity.strategies import data_sampler_runs
from reference import data as ref
from torch_impl import data as tdata

DTYPES = ((np.float32, torch.float32), (np.float64, torch.float64))


# ---------------------------------------------------------------- helpers: the two loops


def ref_stream(loader: ref.Loader, sampler: ref.ResumableSampler, epochs: int,
               stop_after: int | None = None) -> list[tuple[np.ndarray, ...]]:
    """Batches until the sampler reaches epoch `epochs` (or `stop_after` batches)."""
    out: list[tuple[np.ndarray, ...]] = []
    while sampler.epoch < epochs and len(out) != stop_after:
        for batch in loader:
            out.append(batch)
            if len(out) == stop_after:
                break
    return out


def torch_stream(loader: torch.utils.data.DataLoader, sampler: tdata.ResumableSampler,
                 epochs: int, stop_after: int | None = None) -> list[tuple[torch.Tensor, ...]]:
    """The same loop over a DataLoader."""
    out: list[tuple[torch.Tensor, ...]] = []
    while sampler.epoch < epochs and len(out) != stop_after:
        for batch in loader:
            out.append(tuple(batch))
            if len(out) == stop_after:
                break
    return out


def flat(batches: list[tuple]) -> tuple[np.ndarray, ...]:
    """(batch sizes, inputs, labels, values) of a stream, each concatenated."""
    if not batches:
        return (np.zeros(0, np.int64),)
    cols = [np.concatenate([np.asarray(b[i]) for b in batches]) for i in range(3)]
    sizes = np.array([len(b[1]) for b in batches], dtype=np.int64)
    return (sizes, *cols)


def assert_streams(claim_id: str, actual: list[tuple], expected: list[tuple]) -> None:
    assert len(actual) == len(expected), (
        f"claim {claim_id} broken: {len(actual)} batches vs {len(expected)} uninterrupted")
    a, b = flat(actual), flat(expected)
    for name, x, y in zip(("batch sizes", "inputs", "labels", "values"), a, b, strict=False):
        assert_claim(claim_id, x, y, context=name)


def ref_loader(run: dict, task: ref.Task) -> tuple[ref.Loader, ref.ResumableSampler]:
    sampler = ref.ResumableSampler(run["num_samples"], run["seed"])
    return ref.make_loader(task, sampler, run["batch_size"], drop_last=run["drop_last"]), sampler


def torch_loader(run: dict, task: tdata.Task) -> tuple[torch.utils.data.DataLoader,
                                                       tdata.ResumableSampler]:
    sampler = tdata.ResumableSampler(run["num_samples"], run["seed"])
    loader = tdata.make_loader(task, sampler, run["batch_size"], drop_last=run["drop_last"],
                               generator=torch.Generator().manual_seed(0))
    return loader, sampler


# ---------------------------------------------------------------- claims


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), features=st.integers(1, 16),
       hidden=st.integers(1, 32), classes=st.integers(2, 4), dtypes=st.sampled_from(DTYPES))
@settings(max_examples=40)
def test_task_is_bit_identical_across_implementations(
    seed: int, n: int, features: int, hidden: int, classes: int, dtypes: tuple
) -> None:
    """Inputs, labels and values of make_task are the same bits in NumPy and torch."""
    np_dtype, torch_dtype = dtypes
    kw = {"features": features, "hidden": hidden, "classes": classes}
    a = ref.make_task(seed, n, dtype=np_dtype, **kw)
    b = tdata.make_task(seed, n, dtype=torch_dtype, **kw)
    assert_claim("data.task", b.inputs, a.inputs, context="inputs")
    assert_claim("data.task", b.labels, a.labels, context="labels")
    assert_claim("data.task", b.values, a.values, context="values")


@given(seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 2**32 - 1), n=st.integers(1, 3000))
def test_epoch_order_is_the_same_permutation_across_implementations(
    seed: int, epoch: int, n: int
) -> None:
    """epoch_order(seed, epoch, n) is one permutation in both implementations."""
    assert_claim("data.order", tdata.epoch_order(seed, epoch, n), ref.epoch_order(seed, epoch, n))


@given(run=data_sampler_runs())
def test_reference_resume_from_state_dict_equals_uninterrupted_stream(run: dict) -> None:
    """Reference: cut after any batch, save, load into a fresh sampler: same remaining batches."""
    event(f"interrupt: {run['kind']}")
    task = ref.make_task(run["seed"], run["num_samples"])
    loader, sampler = ref_loader(run, task)
    whole = ref_stream(loader, sampler, run["epochs"])

    loader1, sampler1 = ref_loader(run, task)
    head = ref_stream(loader1, sampler1, run["epochs"], stop_after=run["interrupt"])
    state = json.loads(json.dumps(sampler1.state_dict()))  # plain ints survive JSON
    loader2, sampler2 = ref_loader(run, task)
    sampler2.load_state_dict(state)
    tail = ref_stream(loader2, sampler2, run["epochs"])

    assert len(head) == run["interrupt"]
    assert_streams("data.resume_reference", head + tail, whole)


@given(run=data_sampler_runs())
@settings(max_examples=50)
def test_torch_dataloader_resume_from_state_dict_equals_uninterrupted_stream(run: dict) -> None:
    """torch: cut a DataLoader after any batch, restore the sampler: same remaining batches."""
    event(f"interrupt: {run['kind']}")
    task = tdata.make_task(run["seed"], run["num_samples"])
    loader, sampler = torch_loader(run, task)
    whole = torch_stream(loader, sampler, run["epochs"])

    loader1, sampler1 = torch_loader(run, task)
    head = torch_stream(loader1, sampler1, run["epochs"], stop_after=run["interrupt"])
    state = sampler1.state_dict()
    loader2, sampler2 = torch_loader(run, task)
    sampler2.load_state_dict(state)
    tail = torch_stream(loader2, sampler2, run["epochs"])

    assert len(head) == run["interrupt"]
    assert_streams("data.resume_torch", head + tail, whole)


@given(run=data_sampler_runs(), ref_first=st.booleans())
@settings(max_examples=50)
def test_loader_stream_and_cross_implementation_resume_are_bit_identical(
    run: dict, ref_first: bool
) -> None:
    """Both loaders give the same batches, and a state saved by one resumes in the other."""
    event(f"interrupt: {run['kind']}")
    event(f"saved by {'reference' if ref_first else 'torch'}")
    ref_task = ref.make_task(run["seed"], run["num_samples"])
    torch_task = tdata.make_task(run["seed"], run["num_samples"])
    ref_whole = ref_stream(*ref_loader(run, ref_task), run["epochs"])
    torch_whole = torch_stream(*torch_loader(run, torch_task), run["epochs"])
    assert_streams("data.loader", torch_whole, ref_whole)

    if ref_first:
        loader1, sampler1 = ref_loader(run, ref_task)
        head = ref_stream(loader1, sampler1, run["epochs"], stop_after=run["interrupt"])
        loader2, sampler2 = torch_loader(run, torch_task)
        sampler2.load_state_dict(sampler1.state_dict())
        tail = torch_stream(loader2, sampler2, run["epochs"])
    else:
        loader1, sampler1 = torch_loader(run, torch_task)
        head = torch_stream(loader1, sampler1, run["epochs"], stop_after=run["interrupt"])
        loader2, sampler2 = ref_loader(run, ref_task)
        sampler2.load_state_dict(sampler1.state_dict())
        tail = ref_stream(loader2, sampler2, run["epochs"])
    assert_streams("data.loader", [tuple(np.asarray(x) for x in b) for b in head + tail],
                   ref_whole)


def test_resume_claim_can_fail_when_the_state_is_not_restored() -> None:
    """Guard: resuming from a fresh state (weights only, no data position) breaks the claim."""
    run = {"seed": 7, "num_samples": 20, "batch_size": 3, "drop_last": False, "epochs": 2,
           "interrupt": 4}
    task = ref.make_task(run["seed"], run["num_samples"])
    whole = ref_stream(*ref_loader(run, task), run["epochs"])
    loader1, sampler1 = ref_loader(run, task)
    head = ref_stream(loader1, sampler1, run["epochs"], stop_after=run["interrupt"])
    loader2, sampler2 = ref_loader(run, task)  # state NOT loaded
    tail = ref_stream(loader2, sampler2, run["epochs"], stop_after=len(whole) - len(head))
    try:
        assert_streams("data.resume_reference", head + tail, whole)
    except AssertionError as e:
        assert "data.resume_reference" in str(e)
    else:
        raise AssertionError("a resume without the sampler state matched: the test cannot fail")
