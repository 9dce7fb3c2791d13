"""The profiled run's claims (parity/claims/profile.py): the bytes at every phase boundary of
a steady step equal the accountant's formula timeline (torch exactly; the reference but for
two named terms of exact size), every timed step's phases are disjoint ordered intervals of
one clock inside the step, the listed layer's saved tensors are the predicted ones; and the
comparison never hides a gap (a wrong byte or an unmatched time is printed UNEXPLAINED).
Timings themselves are never asserted."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.compare import assert_claim
from parity.drivers import profile as drv
from parity.drivers import profile_gaps as gaps
from parity.drivers import profile_measure as meas
from reference import profile as rprof
from reference import train as rtrain

SMALL = {"sizes": (6, 10, 8, 3), "batch": 5, "steps": 10}


@st.composite
def profile_cases(draw: st.DrawFn, impl: str, device: str = "cpu") -> drv.ProfileCase:
    """Small MLP steps across what changes the bytes: sizes, batch, activation, dropout,
    precision, optimizer, checkpoint schedule."""
    hidden = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    sizes = (draw(st.integers(1, 9)), *hidden, draw(st.integers(2, 9)))  # make_task's range
    precision = draw(st.sampled_from(("fp32", "bf16", "fp16")))
    activation = draw(st.sampled_from(("relu", "tanh", "gelu")))
    dropout = draw(st.sampled_from((0.0, 0.25)))
    n_layers = (len(sizes) - 1) + (len(sizes) - 2) * (2 if dropout else 1)
    specs = ["none", "sqrt", f"uniform:{draw(st.integers(1, n_layers))}"]
    recompute = "none" if impl == "reference" and precision != "fp32" else \
        draw(st.sampled_from(specs))
    event(f"precision {precision}")
    event(f"recompute {recompute.partition(':')[0]}")
    return drv.ProfileCase(impl=impl, device=device, sizes=sizes,
                           batch=draw(st.integers(1, 6)), activation=activation,
                           dropout=dropout, precision=precision, recompute=recompute,
                           optimizer=draw(st.sampled_from(("SGD", "Adam", "AdamW"))), steps=10)


@settings(max_examples=15)
@given(data=st.data())
def test_torch_bytes_at_every_phase_boundary_equal_the_accountants_timeline(
        data: st.DataObject, device: str) -> None:
    case = data.draw(profile_cases("torch", device))
    got, want, where = gaps.boundary_arrays(case, meas.boundary_bytes(case))
    assert len(where) == len(drv.BOUNDARIES) * len(rprof.CATEGORIES)  # nothing skipped
    assert_claim("profile.boundary_bytes", got, want)


@settings(max_examples=30)
@given(case=profile_cases("reference"))
def test_reference_bytes_at_every_boundary_equal_the_timeline_but_for_two_named_terms(
        case: drv.ProfileCase) -> None:
    got, want, where = gaps.boundary_arrays(case, meas.boundary_bytes(case))
    compared = ("forward", "activations") in where
    event("forward activations compared" if compared else "forward activations skipped")
    assert len(where) >= (len(drv.BOUNDARIES) - 1) * len(rprof.CATEGORIES) - 2
    assert_claim("profile.reference_boundary_bytes", got, want)


def test_the_reference_needs_its_two_named_terms_and_each_has_its_exact_size() -> None:
    """The named terms are not decoration: without them the fp32 forward boundary differs
    from the formula, by exactly their sizes."""
    case = drv.ProfileCase(impl="reference", **SMALL)
    formula = dict(drv.formula_timeline(case))
    measured = dict(meas.boundary_bytes(case))
    terms = gaps.reference_memory_terms(case)
    assert terms  # the test below would be empty otherwise
    for (boundary, category), (size, _) in terms.items():
        assert measured[boundary][category] - formula[boundary][category] == size != 0


def test_a_warm_up_step_that_fp16_skips_does_not_count_as_the_steady_step() -> None:
    """A skipped step creates no optimizer state: the metered step must follow an APPLIED
    one. This configuration's first reference step overflows at S = 2^16 (guarded)."""
    case = drv.ProfileCase(impl="reference", precision="fp16", sizes=(2, 2, 2), batch=1,
                           activation="relu", optimizer="SGD", steps=10)
    with np.errstate(over="ignore", invalid="ignore"):
        assert rtrain.Run(case.train_config()).train_step().skipped  # the edge is reached
    got, want, _ = gaps.boundary_arrays(case, meas.boundary_bytes(case))
    assert_claim("profile.reference_boundary_bytes", got, want)


def test_a_byte_no_term_explains_is_printed_unexplained() -> None:
    case = drv.ProfileCase(impl="torch", **SMALL)
    timeline = drv.formula_timeline(case)
    honest = gaps.memory_rows(case, {"timeline": timeline}, {"memory": timeline})
    assert not any(r["term"] for r in honest)
    lost = [(b, {**c, "grads": 0} if b == "backward" else c) for b, c in timeline]
    rows = gaps.memory_rows(case, {"timeline": timeline}, {"memory": lost})
    bad = [(r["boundary"], r["category"]) for r in rows if r["term"] == gaps.UNEXPLAINED]
    assert bad == [("backward", "grads")]
    # a named term matches only its exact size: the reference's target copy, one byte off
    ref = dataclasses.replace(case, impl="reference")
    ref_timeline = drv.formula_timeline(ref)
    off = [(b, {**c, "batch": c["batch"] + 8 * ref.batch + (b == "forward")})
           if b == "forward" else (b, c) for b, c in ref_timeline]
    rows = gaps.memory_rows(ref, {"timeline": ref_timeline}, {"memory": off})
    assert [r["category"] for r in rows if r["term"] == gaps.UNEXPLAINED] == ["batch"]


@pytest.mark.parametrize("impl", drv.IMPLS)
def test_phases_are_disjoint_ordered_intervals_inside_each_step(impl: str, device: str) -> None:
    case = drv.ProfileCase(impl=impl, device=device if impl == "torch" else "cpu", **SMALL)
    phases = tuple(p for p in drv.BOUNDARIES[1:] if impl == "torch" or p != "host-to-device")
    steps = meas.timed_steps(case, 4)
    faults = [meas.interval_faults(s, phases) for s in steps]
    assert_claim("profile.phase_intervals", np.array([len(f) for f in faults], dtype=np.int64),
                 np.zeros(len(steps), dtype=np.int64))
    for s in steps:  # so the phases and what lies outside them sum to the step, exactly
        seconds = s.seconds()
        assert seconds["outside the phases"] >= 0
        assert sum(e - b for b, e in s.phases.values()) <= s.end - s.start


def test_the_interval_check_sees_overlap_order_and_a_missing_phase() -> None:
    """interval_faults is what the claim counts: each kind of disorder yields a fault."""
    phases = ("data wait", "forward")
    good = rprof.Step(0, 10, {"data wait": (1, 3), "forward": (3, 9)})
    assert meas.interval_faults(good, phases) == []
    broken = [rprof.Step(0, 10, {"data wait": (1, 5), "forward": (4, 9)}),  # overlap
              rprof.Step(0, 10, {"data wait": (5, 9), "forward": (1, 3)}),  # out of order
              rprof.Step(0, 10, {"data wait": (1, 3)}),  # missing
              rprof.Step(0, 8, {"data wait": (1, 3), "forward": (3, 9)}),  # past the end
              rprof.Step(2, 10, {"data wait": (1, 3), "forward": (3, 9)})]  # before the start
    for step in broken:
        assert meas.interval_faults(step, phases), step


@pytest.mark.parametrize(("impl", "precision"), [("torch", "fp32"), ("torch", "bf16"),
                                                 ("torch", "fp16"), ("reference", "fp32")])
def test_the_listed_layers_saved_tensors_are_the_predicted_ones(impl: str, precision: str,
                                                                device: str) -> None:
    case = drv.ProfileCase(impl=impl, precision=precision,
                           device=device if impl == "torch" else "cpu", **SMALL)
    predicted = drv.predict(case, drv.NO_MACHINE)["layer"]["saves"]
    measured = meas.layer_saves(case)
    assert predicted and measured
    assert_claim("profile.saved_tensors",
                 np.array([gaps.saves_mismatches(measured, predicted)]), np.array([0]))


def test_a_phase_time_is_as_predicted_explained_or_unexplained_never_hidden() -> None:
    spread = {"median": 10.0, "q1": 9.9, "q3": 10.1}
    assert gaps.verdict(9.0, spread, []) == "as predicted"
    assert gaps.verdict(1.0, spread, [{"term": "t", "seconds": 8.5}]) == "explained"
    assert gaps.verdict(1.0, spread, []).startswith(gaps.UNEXPLAINED)
    over = gaps.verdict(1.0, spread, [{"term": "t", "seconds": 30.0}])
    assert over.startswith(gaps.UNEXPLAINED) and "333%" in over  # a term too large is a gap


@pytest.mark.cuda
def test_cuda_phases_hold_at_least_the_formulas_bytes_and_the_sync_variants_run(
        cuda_device: str) -> None:
    """On a GPU: each phase's memory_allocated at its end holds at least the formula's device
    bytes plus the allocator's 512-byte rounding of the storages counted (the caching
    allocator never hands out less; other tests' tensors and an earlier cuBLAS workspace may
    add more in this process: the command's own process names them exactly), its peak at
    least its end; the three honest-timing variants run, the seeded .item() included."""
    case = drv.ProfileCase(impl="torch", device=cuda_device, steps=6, wait=1, warmup=1,
                           active=2, repeats=1)
    sheet = drv.predict(case, drv.probe_machine(case))
    measured = meas.measure(case, None)
    rows = gaps.cuda_rows(case, sheet, measured)
    assert [r["phase"] for r in rows] == list(sheet["seconds"])
    for r in rows:
        assert r["end"] >= r["formula"] + r["allocator rounding"] and r["peak"] >= r["end"], r
    assert measured["fault_calls"] == 2  # one forward per round, repeats + 1 rounds
    assert set(measured["honest"]) == {"synchronized", "unsynchronized",
                                       "unsynchronized, .item() in forward"}
