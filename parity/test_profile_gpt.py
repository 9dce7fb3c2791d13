"""The profiled transformer step's claims (parity/claims/profile.py): in both trees the bytes at
every phase boundary equal the timeline built from the transformer's accountant, with no named
term; the reference's own tape count reads the same held bytes a second way; the first block's
saved tensors are the predicted ones; and the whole command names no byte gap. Timings are
never asserted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.compare import assert_claim
from parity.drivers import profile as drv
from parity.drivers import profile_gaps as gaps
from parity.drivers import profile_measure as meas
from parity.drivers import profile_run
from reference import profile as rprof


@st.composite
def gpt_cases(draw: st.DrawFn, impl: str, device: str = "cpu") -> drv.ProfileCase:
    """Small steps of train --model gpt's transformer across what changes the bytes: batch,
    precision, optimizer, dropout, block schedule."""
    recompute = draw(st.sampled_from(("none", "sqrt", "uniform:2", "uniform:4", "optimal:1")))
    # CUDA autocast's transformer saves are not modelled by the accountant (it says so)
    precision = draw(st.sampled_from(("fp32",) if device != "cpu" else ("fp32", "bf16", "fp16")))
    dropout = draw(st.sampled_from((0.0, 0.1)))
    event(f"precision {precision}")
    event(f"recompute {recompute}")
    return drv.ProfileCase(impl=impl, model="gpt", device=device, batch=draw(st.integers(1, 3)),
                           precision=precision, recompute=recompute, dropout=dropout,
                           optimizer=draw(st.sampled_from(("SGD", "Adam", "AdamW"))), steps=10)


def _forward_activations(case: drv.ProfileCase) -> int:
    return dict(drv.formula_timeline(case))["forward"]["activations"]


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_torch_gpt_bytes_at_every_phase_boundary_equal_the_accountants_timeline(
        data: st.DataObject, device: str) -> None:
    case = data.draw(gpt_cases("torch", device))
    got, want, where = gaps.boundary_arrays(case, meas.boundary_bytes(case))
    assert len(where) == len(drv.BOUNDARIES) * len(rprof.CATEGORIES)  # nothing skipped
    assert_claim("profile.gpt_boundary_bytes", got, want)


@settings(max_examples=8, deadline=None)
@given(case=gpt_cases("reference"))
def test_reference_gpt_bytes_at_every_phase_boundary_equal_the_same_timeline_with_no_term(
        case: drv.ProfileCase) -> None:
    got, want, where = gaps.boundary_arrays(case, meas.boundary_bytes(case))
    assert gaps.reference_memory_terms(case) == {}  # no named term to hide behind
    assert len(where) == (len(drv.BOUNDARIES) - 1) * len(rprof.CATEGORIES)  # all compared
    assert_claim("profile.gpt_boundary_bytes", got, want)


def test_a_block_schedule_changes_the_held_bytes_the_timeline_predicts() -> None:
    """The property tests above compare schedules that really differ: a checkpointed block
    keeps only its input (the first block's saves are far more than its input)."""
    plain = drv.ProfileCase(impl="torch", model="gpt", batch=2)
    held = {spec: _forward_activations(drv.ProfileCase(impl="torch", model="gpt", batch=2,
                                                       recompute=spec))
            for spec in ("none", "uniform:2", "sqrt")}
    assert held["none"] > held["uniform:2"] and held["none"] > held["sqrt"]
    assert held["none"] == _forward_activations(plain)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("recompute", ["none", "sqrt", "uniform:4", "optimal:2"])
def test_the_sheets_flops_per_phase_are_what_torch_counts_for_any_block_schedule(
        recompute: str, dropout: float, device: str) -> None:
    from torch_impl import accounting as tacc

    case = drv.ProfileCase(impl="torch", model="gpt", batch=2, recompute=recompute,
                           dropout=dropout, device=device)
    run, data, _ = meas.torch_parts(case)
    x, y = (t.to(device) for t in data())
    with tacc.StepMeter(run.model) as meter:
        loss = run.loss_fn(run.model(x), y)
        meter.backward_begins()
        loss.backward()
    counted, sheet = meter.flops.as_dict(), drv.tree_flops(case)
    phases = ("forward", "backward", "recompute")
    assert (sheet["recompute"] > 0) == (recompute != "none")  # the schedule is exercised
    assert_claim("profile.gpt_flops", np.array([counted.get(p, 0) for p in phases]),
                 np.array([sheet[p] for p in phases]))


def test_the_sheets_forward_flops_are_the_reference_tapes_own_gemm_count() -> None:
    from reference import accounting_gpt as ragpt

    case = drv.ProfileCase(impl="reference", model="gpt", batch=3)
    run, data, _ = meas.reference_parts(case)
    x, y = data()
    run.model.forward(x, y)
    assert_claim("profile.gpt_flops", np.array([ragpt.gpt_tape_flops(run.model)]),
                 np.array([drv.tree_flops(case)["forward"]]))


@pytest.mark.parametrize(("precision", "recompute"), [("fp32", "none"), ("bf16", "sqrt"),
                                                      ("fp16", "uniform:2")])
def test_the_reference_gpts_own_tape_count_reads_the_same_held_bytes(precision: str,
                                                                     recompute: str) -> None:
    case = drv.ProfileCase(impl="reference", model="gpt", batch=2, precision=precision,
                           recompute=recompute)
    tape = meas.reference_tape_bytes(case)
    formula = gaps.tape_formula(drv.formula_timeline(case))
    assert dict(tape)["forward"] > 0  # the forward's end holds the tape: the edge is reached
    assert_claim("profile.gpt_reference_tape", np.array([v for _, v in tape]),
                 np.array([formula[b] for b, _ in tape]))


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("impl", drv.IMPLS)
def test_the_first_blocks_saved_tensors_are_the_predicted_ones(impl: str, precision: str,
                                                               device: str) -> None:
    # the run checkpoints the listed block (uniform:2: blocks 0-1 one segment); its saves are
    # listed from a forward without checkpoints, as the sheet predicts them
    if impl == "torch" and device != "cpu" and precision != "fp32":
        pytest.skip("CUDA autocast's transformer saves are not in the accountant (gpt_saved)")
    case = drv.ProfileCase(impl=impl, model="gpt", batch=2, precision=precision,
                           recompute="uniform:2", device=device if impl == "torch" else "cpu")
    predicted = drv.predict(case, drv.NO_MACHINE)["layer"]["saves"]
    measured = meas.layer_saves(case)
    # the attention core's saves are found and attributed to the block (its bmm operands,
    # mask, softmax result run between the block's Linears, inside no leaf module)
    assert sum(s["module"].endswith("attn.core") for s in measured) == 6
    assert_claim("profile.saved_tensors",
                 np.array([gaps.saves_mismatches(measured, predicted)]), np.array([0]))


@pytest.mark.parametrize("impl", drv.IMPLS)
def test_gpt_phases_are_disjoint_ordered_intervals_inside_each_step(impl: str,
                                                                    device: str) -> None:
    case = drv.ProfileCase(impl=impl, model="gpt", batch=2, recompute="sqrt",
                           device=device if impl == "torch" else "cpu")
    phases = tuple(p for p in drv.BOUNDARIES[1:] if impl == "torch" or p != "host-to-device")
    steps = meas.timed_steps(case, 3)
    faults = [meas.interval_faults(s, phases) for s in steps]
    assert_claim("profile.phase_intervals", np.array([len(f) for f in faults], dtype=np.int64),
                 np.zeros(len(steps), dtype=np.int64))


@pytest.mark.parametrize("impl", drv.IMPLS)
def test_a_whole_gpt_profile_names_every_byte_and_predicts_before_it_measures(
        impl: str, tmp_path: Path) -> None:
    case = drv.ProfileCase(impl=impl, model="gpt", batch=2, precision="bf16", steps=4, wait=1,
                           warmup=1, active=2, repeats=1)
    result = profile_run.run_profile(case, tmp_path, pictures=False)
    comp = result["comparison"]
    assert comp["unexplained"]["memory"] == 0
    assert len(comp["memory"]) == len(result["measured"]["memory"]) * len(rprof.CATEGORIES)
    assert result["predictions"]["written_ns"] < result["measured"]["measured_from_ns"]
    assert (impl == "reference") == bool(comp["tape"])  # the reference's own count, compared
    md = (tmp_path / "profile.md").read_text()
    assert "Block `transformer.h.0`'s saved tensors" in md and "attn.core" in md
    for row in comp["time"]:  # every phase row carries a verdict; none is left blank
        assert row["phase"] == "step" or row["verdict"]
