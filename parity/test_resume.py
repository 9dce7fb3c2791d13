"""Parity of reference.resume and torch_impl.resume: a training state crosses between the
implementations losslessly (claim resume.cross_impl_state), and both trees refuse the same
crafted files (valid digest, hostile content) with the same error (resume.crafted_refused).

The drivers (reference_state, through_torch, through_reference, crafted) are in
parity/drivers/resume.py, shared with the report. Random streams are the one part that
cannot cross (NOTE [ Cross-implementation mapping ] in torch_impl/resume.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.compare import assert_claim
from parity.drivers.resume import (
    CASES,
    CONTAINER_CASES,
    OPTIMIZERS,
    SCHEDULES,
    compare_states,
    crafted,
    crafted_outcomes,
    flatten,
    reference_objects,
    reference_state,
    through_reference,
    through_torch,
    torch_objects,
)
from parity.strategies import examples
from reference import resume as ref_resume
from torch_impl import resume as t_resume


def test_an_adamw_state_saved_and_restored_by_either_tree_comes_back_alike(tmp_path: Path
                                                                             ) -> None:
    """One reference state after three AdamW steps, saved, loaded and restored into objects
    by each tree, reads back with every mapped bit equal."""
    state = reference_state("AdamW", "StepLR", 3, seed=0)  # an MLP (8, 16, 3), its moments
    ref_resume.save_checkpoint(tmp_path / "ref.ckpt", state)
    t_resume.save_checkpoint(tmp_path / "torch.ckpt", t_resume.state_from_reference(state))
    ref_loaded = ref_resume.load_checkpoint(tmp_path / "ref.ckpt")
    torch_loaded = t_resume.load_checkpoint(tmp_path / "torch.ckpt")
    ref_model, ref_opt, ref_sched = reference_objects(ref_loaded)
    torch_model, torch_opt, torch_sched = torch_objects(torch_loaded)
    for ref_obj, torch_obj, key in [(ref_model, torch_model, "model"),
                                    (ref_opt, torch_opt, "optimizer"),
                                    (ref_sched, torch_sched, "scheduler")]:
        ref_obj.load_state_dict(ref_loaded[key])
        torch_obj.load_state_dict(torch_loaded[key])
        ref_loaded[key] = ref_obj.state_dict()
        torch_loaded[key] = torch_obj.state_dict()
    ref_back = flatten({k: ref_loaded[k] for k in t_resume.MAPPED_KEYS})
    torch_back = flatten({k: t_resume.state_to_reference(torch_loaded)[k]
                          for k in t_resume.MAPPED_KEYS})
    assert sorted(torch_back) == sorted(ref_back) and "optimizer/state/0/exp_avg" in ref_back
    for key, ref_value in ref_back.items():
        assert_claim("resume.cross_impl_state", actual=torch_back[key], expected=ref_value,
                     context=key)


@settings(examples(30))
@given(optimizer=st.sampled_from(sorted(OPTIMIZERS)), schedule=st.sampled_from(sorted(SCHEDULES)),
       steps=st.integers(0, 9), seed=st.integers(0, 2**32 - 1))
def test_reference_state_through_torch_and_back_is_bit_identical(
        optimizer: str, schedule: str, steps: int, seed: int) -> None:
    """reference -> torch checkpoint -> torch objects -> reference keeps every mapped bit."""
    state = reference_state(optimizer, schedule, steps, seed)
    with tempfile.TemporaryDirectory() as tmp:
        back = through_torch(through_reference(state, Path(tmp)), Path(tmp))
    worst, n = compare_states("resume.cross_impl_state", back, state)
    assert n > 0 and worst == 0
    assert back["rng"] is None  # the one part that does not cross


@settings(examples(20))
@given(optimizer=st.sampled_from(sorted(OPTIMIZERS)), schedule=st.sampled_from(sorted(SCHEDULES)),
       steps=st.integers(1, 6))
def test_torch_state_through_reference_and_back_is_bit_identical(
        optimizer: str, schedule: str, steps: int) -> None:
    """torch objects -> reference checkpoint -> reference objects -> torch keeps every bit."""
    template = reference_state(optimizer, schedule, 0, 0)
    model, opt, sched = torch_objects(template)
    g = torch.Generator().manual_seed(steps)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
        sched.step()
    torch_state = {**template, "model": model.state_dict(), "optimizer": opt.state_dict(),
                   "scheduler": sched.state_dict(), "rng": None}
    with tempfile.TemporaryDirectory() as tmp:
        ref_state = through_reference(t_resume.state_to_reference(torch_state), Path(tmp))
    back = t_resume.state_from_reference(ref_state)
    model2, opt2, sched2 = torch_objects(template)
    model2.load_state_dict(back["model"])
    opt2.load_state_dict(back["optimizer"])
    sched2.load_state_dict(back["scheduler"])
    expected = flatten({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict()})
    actual = flatten({"model": model2.state_dict(), "optimizer": opt2.state_dict(),
                      "scheduler": sched2.state_dict()})
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        assert_claim("resume.cross_impl_state", actual=actual[key], expected=value, context=key)


def test_a_changed_bit_breaks_the_cross_impl_comparison() -> None:
    """Guard: compare_states sees one flipped parameter bit (the comparison can fail)."""
    state = reference_state("Adam", "StepLR", 3, 0)
    with tempfile.TemporaryDirectory() as tmp:
        back = through_torch(state, Path(tmp))
    w = back["model"]["0.weight"]
    w.view(np.uint32)[0, 0] ^= np.uint32(1)
    worst, _ = compare_states("resume.cross_impl_state", back, state)
    assert worst == 1


@pytest.mark.parametrize("case", [*CASES, *CONTAINER_CASES])
def test_both_trees_refuse_each_crafted_file_with_the_same_error(case: str,
                                                                 tmp_path: Path) -> None:
    """A file with a valid digest and hostile content (a length beyond the file, nesting
    deeper than any parser's recursion, a state that is not a dict, a structure that does not
    fit) is a CheckpointCorruptError in both trees; the control case loads in both."""
    codes = crafted_outcomes(case, tmp_path)
    assert_claim("resume.crafted_refused", actual=codes["actual"], expected=codes["expected"],
                 context=f"{case}: {codes['names']}")
    if not case.startswith("control"):
        assert codes["names"][0] == "CheckpointCorruptError"  # the reference: always


def test_a_crafted_file_loads_as_corrupt_without_reading_its_declared_size(
        tmp_path: Path) -> None:
    """Guard for the table: the crafted lengths are really out of bounds (4e12 bytes)."""
    blob = crafted("array larger than its bytes", ref_resume.PAYLOAD)
    assert len(blob) < 4096
    with pytest.raises(ref_resume.CheckpointCorruptError, match="4000000000000 bytes"):
        (tmp_path / "a.ckpt").write_bytes(blob)
        ref_resume.load_checkpoint(tmp_path / "a.ckpt")
