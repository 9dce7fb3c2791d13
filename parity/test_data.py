"""Parity of the data topic: the same task, the same order, the same resumed stream, the
same announced lengths.

reference/data.py (NumPy) and torch_impl/data.py (torch, on the --device) compute the task
and the epoch orders independently from one documented integer hash; both pipelines are
driven by one loop (parity/drivers/data.py); each claim is in parity/claims/data.py.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.compare import assert_claim, expect_broken
from parity.drivers.data import (
    SIDES,
    assert_streams,
    lengths,
    make_task,
    pipeline,
    resumed,
    stream,
    worker_pipeline,
)
from parity.strategies import data_sampler_runs, examples
from parity.strategies.data import data_length_cases
from reference import data as ref
from torch_impl import data as tdata

DTYPES = ((np.float32, torch.float32), (np.float64, torch.float64))
PURPOSE_NAMES = ("ORDER", "INPUTS", "TEACHER", "CALIBRATION", "SEQUENCES", "LOADER", "BATCH")
ROOT = Path(__file__).resolve().parents[1]


def test_loader_resumed_mid_epoch_matches_torch_dataloader_bitwise(device: str) -> None:
    """A loader stopped after one batch and resumed from its sampler's state_dict yields the
    same batches, bit for bit, in the reference's Loader and in torch's DataLoader."""
    ref_task = ref.make_task(seed=3, num_samples=10, features=2)
    torch_task = tdata.make_task(seed=3, num_samples=10, features=2, device=device)
    ref_loader = ref.make_loader(ref_task, ref.ResumableSampler(10, seed=5), 4)
    torch_loader = tdata.make_loader(torch_task, tdata.ResumableSampler(10, seed=5), 4,
                                     generator=torch.Generator().manual_seed(0))
    ref_head = next(iter(ref_loader))[0]  # (4, 2): the batch before the interruption
    torch_head = next(iter(torch_loader))[0]
    ref_state = ref_loader.batch_sampler.sampler.state_dict()  # {'epoch': 0, 'position': 4, ..}
    torch_state = torch_loader.batch_sampler.sampler.state_dict()
    ref_sampler = ref.ResumableSampler(10, seed=5)
    torch_sampler = tdata.ResumableSampler(10, seed=5)
    ref_sampler.load_state_dict(ref_state)
    torch_sampler.load_state_dict(torch_state)
    ref_tail = [x for x, _, _ in ref.make_loader(ref_task, ref_sampler, 4)]  # (4, 2), (2, 2)
    torch_tail = [x for x, _, _ in tdata.make_loader(torch_task, torch_sampler, 4,
                                                     generator=torch.Generator())]
    assert ref_state["position"] == 4 and len(ref_tail) == 2  # resumed mid-epoch, to its end
    assert_claim("data.loader", actual=torch.cat([torch_head, *torch_tail]).cpu(),
                 expected=np.concatenate([ref_head, *ref_tail]))


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), features=st.integers(1, 16),
       hidden=st.integers(1, 32), classes=st.integers(2, 4), dtypes=st.sampled_from(DTYPES))
@settings(examples(40))
def test_task_is_bit_identical_across_implementations(
    seed: int, n: int, features: int, hidden: int, classes: int, dtypes: tuple, device: str
) -> None:
    """Inputs, labels and values of make_task are the same bits in NumPy and torch."""
    np_dtype, torch_dtype = dtypes
    kw = {"features": features, "hidden": hidden, "classes": classes}
    a = ref.make_task(seed, n, dtype=np_dtype, **kw)
    b = tdata.make_task(seed, n, dtype=torch_dtype, device=device, **kw)
    assert_claim("data.task", actual=b.inputs.cpu(), expected=a.inputs, context="inputs")
    assert_claim("data.task", actual=b.labels.cpu(), expected=a.labels, context="labels")
    assert_claim("data.task", actual=b.values.cpu(), expected=a.values, context="values")


@given(seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 2**32 - 1), n=st.integers(1, 512))
@settings(examples(100))  # an explicit budget, so a profile's scaling applies to it once
def test_epoch_order_is_the_same_permutation_across_implementations(
    seed: int, epoch: int, n: int, device: str
) -> None:
    """epoch_order(seed, epoch, n) is one permutation in both implementations (n <= 512 here,
    cheap per example; the slow variant below goes to 2^16)."""
    assert_claim("data.order", actual=tdata.epoch_order(seed, epoch, n, device).cpu(),
                 expected=ref.epoch_order(seed, epoch, n))


@pytest.mark.slow
@given(seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 2**32 - 1),
       n=st.integers(513, 2**16))
@settings(examples(20))
def test_epoch_order_of_large_datasets_is_the_same_permutation_across_implementations(
    seed: int, epoch: int, n: int, device: str
) -> None:
    """The same for 513 <= n <= 2^16 (slow: up to ~10 ms per example)."""
    assert_claim("data.order", actual=tdata.epoch_order(seed, epoch, n, device).cpu(),
                 expected=ref.epoch_order(seed, epoch, n))


@given(run=data_sampler_runs())
@settings(examples(100))  # an explicit budget, so a profile's scaling applies to it once
def test_reference_resume_from_state_dict_equals_uninterrupted_stream(run: dict) -> None:
    """Reference: cut after any batch, save, load into a fresh sampler: same remaining batches."""
    event(f"interrupt: {run['kind']}")
    tasks = {"reference": make_task("reference", run["seed"], run["num_samples"])}
    whole = stream(pipeline("reference", tasks["reference"], run), run["epochs"])
    head, tail = resumed(run, tasks, "reference", "reference")
    assert len(head) == run["interrupt"]
    assert_streams("data.resume_reference", head + tail, whole)


@given(run=data_sampler_runs())
@settings(examples(50))
def test_torch_dataloader_resume_from_state_dict_equals_uninterrupted_stream(
        run: dict, device: str) -> None:
    """torch: cut a DataLoader after any batch, restore the sampler: same remaining batches."""
    event(f"interrupt: {run['kind']}")
    tasks = {"torch": make_task("torch", run["seed"], run["num_samples"], device)}
    whole = stream(pipeline("torch", tasks["torch"], run), run["epochs"])
    head, tail = resumed(run, tasks, "torch", "torch")
    assert len(head) == run["interrupt"]
    assert_streams("data.resume_torch", head + tail, whole)


@given(run=data_sampler_runs(), saved_by=st.sampled_from(SIDES))
@settings(examples(50))
def test_loader_stream_and_cross_implementation_resume_are_bit_identical(
    run: dict, saved_by: str, device: str
) -> None:
    """Both loaders give the same batches, and a state saved by one resumes in the other."""
    event(f"interrupt: {run['kind']}")
    event(f"saved by {saved_by}")
    tasks = {side: make_task(side, run["seed"], run["num_samples"], device) for side in SIDES}
    ref_whole = stream(pipeline("reference", tasks["reference"], run), run["epochs"])
    torch_whole = stream(pipeline("torch", tasks["torch"], run), run["epochs"])
    assert_streams("data.loader", torch_whole, ref_whole)
    resumed_by = "torch" if saved_by == "reference" else "reference"
    head, tail = resumed(run, tasks, saved_by, resumed_by)
    assert_streams("data.loader", head + tail, ref_whole)


@given(case=data_length_cases())
@settings(examples(60))
def test_sampler_and_loader_lengths_agree_across_trees_and_with_what_they_yield(
        case: dict, device: str) -> None:
    """After any number of samples consumed, len(sampler) and len(loader) are equal in both
    trees and equal to the indices and batches the next iter() yields."""
    event(f"consumed: {case['where']}")
    event(f"via {case['via']}, drop_last={case['drop_last']}")
    a = lengths("reference", make_task("reference", case["seed"], case["num_samples"]), case,
                case["consumed"], case["via"])
    b = lengths("torch", make_task("torch", case["seed"], case["num_samples"], device), case,
                case["consumed"], case["via"])
    assert_claim("data.length", actual=b, expected=a,
                 context="[len(sampler), yielded, len(loader), yielded], torch " "vs reference")
    for side, v in (("reference", a), ("torch", b)):
        assert_claim("data.length", actual=v[[0, 2]], expected=v[[1, 3]],
                     context=f"{side}: announced vs yielded")


def test_resume_claim_can_fail_when_the_state_is_not_restored() -> None:
    """Guard: resuming from a fresh state (weights only, no data position) breaks the claim."""
    run = {"seed": 7, "num_samples": 20, "batch_size": 3, "drop_last": False, "epochs": 2,
           "interrupt": 4}
    task = make_task("reference", run["seed"], run["num_samples"])
    whole = stream(pipeline("reference", task, run), run["epochs"])
    head = stream(pipeline("reference", task, run), run["epochs"], stop_after=run["interrupt"])
    tail = stream(pipeline("reference", task, run), run["epochs"],  # state NOT loaded
                  stop_after=len(whole) - len(head))
    with expect_broken("data.resume_reference"):
        assert_streams("data.resume_reference", head + tail, whole)


@given(seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 2**32 - 1),
       batch=st.integers(0, 4096))
@settings(examples(50))
def test_batch_seed_is_the_same_word_across_implementations(seed: int, epoch: int,
                                                            batch: int) -> None:
    """batch_seed(seed, epoch, batch), the seed of a batch's randomness: the same 32 bits."""
    assert_claim("data.loader", actual=np.array([tdata.batch_seed(seed, epoch, batch)], np.uint64),
                 expected=np.array([ref.batch_seed(seed, epoch, batch)], np.uint64))


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@pytest.mark.parametrize(("drop_last", "saved_by"), [(True, "workers"), (False, "reference"),
                                                     (False, "workers")])
def test_the_reference_order_is_the_consumed_order_of_a_worker_loader(
        drop_last: bool, saved_by: str) -> None:
    """torch with 2 loader workers gives the reference's batches, and a state saved by one
    (the workers' counts consumed batches, not prefetched ones) resumes in the other.
    CPU: worker processes index a CPU task."""
    run = {"seed": 11, "num_samples": 23, "batch_size": 3, "drop_last": drop_last,
           "epochs": 3, "interrupt": 9}
    ref_task, torch_task = make_task("reference", 11, 23), make_task("torch", 11, 23)
    ref_whole = stream(pipeline("reference", ref_task, run), run["epochs"])
    first = worker_pipeline(torch_task, run, 2)
    second = worker_pipeline(torch_task, run, 2)
    try:
        assert_streams("data.loader", stream(first, run["epochs"]), ref_whole)
        writer = second if saved_by == "workers" else pipeline("reference", ref_task, run)
        head = stream(writer, run["epochs"], stop_after=run["interrupt"])
        reader = (pipeline("reference", ref_task, run) if saved_by == "workers"
                  else worker_pipeline(torch_task, run, 2))
        reader.sampler.load_state_dict(json.loads(json.dumps(writer.sampler.state_dict())))
        try:
            tail = stream(reader, run["epochs"])
        finally:
            getattr(reader.loader, "close", lambda: None)()
        assert_streams("data.loader", head + tail, ref_whole)
    finally:
        first.loader.close()
        second.loader.close()


def test_every_hash_purpose_has_its_own_number_in_both_trees() -> None:
    """The purposes of the one hash are distinct numbers, the same in both trees, and every
    hash_words call in either tree passes one of them by name (or `purpose`, the parameter
    of _inputs, whose callers pass INPUTS or CALIBRATION): no two streams share a key."""
    for mod in (ref, tdata):
        assert tuple(getattr(mod, name) for name in PURPOSE_NAMES) == mod.PURPOSES
    assert ref.PURPOSES == tdata.PURPOSES
    assert len(set(ref.PURPOSES)) == len(PURPOSE_NAMES)
    passed: dict[str, set[str]] = {"hash_words": set(), "_inputs": set()}
    for path in [*(ROOT / "reference").glob("*.py"), *(ROOT / "torch_impl").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
                name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                if name in passed:
                    purpose = node.args[1]
                    assert isinstance(purpose, ast.Name), f"{path.name}:{node.lineno}"
                    passed[name].add(purpose.id)
    assert {"LOADER", "BATCH"} <= passed["hash_words"]  # the loader's and a batch's seeds
    assert passed["hash_words"] <= {*PURPOSE_NAMES, "purpose"}
    assert passed["_inputs"] == {"INPUTS", "CALIBRATION"}
