"""The profiled run's claims (parity/claims/profile.py): the bytes at every phase boundary of
a steady step equal the accountant's formula timeline (the MLP: torch exactly, the reference
but for two named terms of exact size; the transformer: both trees exactly, with the
reference's own tape count as a second reading), every timed step's phases are disjoint
ordered intervals of one clock inside the step, the listed layer's saved tensors are the
predicted ones, the transformer sheet's FLOPs are what torch counts; and the comparison never
hides a gap (a wrong byte or an unmatched time is printed UNEXPLAINED). Timings themselves
are never asserted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.compare import assert_claim
from parity.drivers import profile as drv
from parity.drivers import profile_gaps as gaps
from parity.drivers import profile_measure as meas
from parity.lab.runners import profile_run
from parity.strategies import examples
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


@settings(examples(15))
@given(data=st.data())
def test_torch_bytes_at_every_phase_boundary_equal_the_accountants_timeline(
        data: st.DataObject, device: str) -> None:
    case = data.draw(profile_cases("torch", device))
    got, want, where = gaps.boundary_arrays(case, meas.boundary_bytes(case))
    assert len(where) == len(drv.BOUNDARIES) * len(rprof.CATEGORIES)  # nothing skipped
    assert_claim("profile.boundary_bytes", actual=got, expected=want)


@settings(examples(30))
@given(case=profile_cases("reference"))
def test_reference_bytes_at_every_boundary_equal_the_timeline_but_for_two_named_terms(
        case: drv.ProfileCase) -> None:
    got, want, where = gaps.boundary_arrays(case, meas.boundary_bytes(case))
    compared = ("forward", "activations") in where
    event("forward activations compared" if compared else "forward activations skipped")
    assert len(where) >= (len(drv.BOUNDARIES) - 1) * len(rprof.CATEGORIES) - 2
    assert_claim("profile.reference_boundary_bytes", actual=got, expected=want)


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
    assert_claim("profile.reference_boundary_bytes", actual=got, expected=want)


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
    assert_claim("profile.phase_intervals",
                 actual=np.array([len(f) for f in faults], dtype=np.int64),
                 expected=np.zeros(len(steps), dtype=np.int64))
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
                 actual=np.array([gaps.saves_mismatches(measured, predicted)]),
                 expected=np.array([0]))


def test_a_phase_time_is_as_predicted_explained_or_unexplained_never_hidden() -> None:
    spread = {"median": 10.0, "q1": 9.9, "q3": 10.1}
    assert gaps.verdict(9.0, spread, []) == "as predicted"
    assert gaps.verdict(1.0, spread, [{"term": "t", "seconds": 8.5}]) == "explained"
    assert gaps.verdict(1.0, spread, []).startswith(gaps.UNEXPLAINED)
    over = gaps.verdict(1.0, spread, [{"term": "t", "seconds": 30.0}])
    assert over.startswith(gaps.UNEXPLAINED) and "333%" in over  # a term too large is a gap


@pytest.mark.cuda
def test_cuda_phases_hold_the_formulas_bytes_each_its_own_peak_and_the_sync_variants_run(
        cuda_device: str) -> None:
    """On a GPU: each phase's memory_allocated at its end holds at least the formula's device
    bytes plus the allocator's 512-byte rounding of the storages counted (the caching
    allocator never hands out less; other tests' tensors and an earlier cuBLAS workspace may
    add more in this process: the command's own process names them exactly). Each phase's
    peak is its own (the meter resets it at the phase's start): with 256 rows (the whole
    task) the backward holds the activations and the new gradients at once, far above
    anything AdamW's step adds to what it starts with (foreach: a sqrt of every exp_avg_sq,
    one rounded copy of the parameters; the single-tensor path: two copies of one), so a
    meter that kept the step's peak would report the optimizer above its bound. The three
    honest-timing variants run, the seeded .item() included."""
    from torch_impl.accounting import cuda_allocated

    case = drv.ProfileCase(impl="torch", device=cuda_device, steps=6, wait=1, warmup=1,
                           active=2, repeats=1, batch=256)
    sheet = drv.predict(case, drv.probe_machine(case))
    measured = meas.measure(case, None)
    rows = gaps.cuda_rows(case, sheet, measured)
    assert [r["phase"] for r in rows] == list(sheet["seconds"])
    for r in rows:
        assert r["end"] >= r["formula"] + r["allocator rounding"], r
    layers = list(zip(case.sizes[:-1], case.sizes[1:], strict=True))
    params = sum(cuda_allocated(4 * n) for i, o in layers for n in (i * o, o))
    by = {r["phase"]: r for r in rows}
    backward, optimizer = by["backward"], by["optimizer"]
    assert optimizer["peak"] - optimizer["start"] <= 2 * params, (optimizer, params)
    assert backward["peak"] - optimizer["start"] > 2 * params, (backward, optimizer, params)
    assert measured["fault_calls"] == 2  # one forward per round, repeats + 1 rounds
    assert set(measured["honest"]) == {"synchronized", "unsynchronized",
                                       "unsynchronized, .item() in forward"}


# ---------------------------------------------------------------- the compact transformer
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


@settings(examples(10), deadline=None)
@given(data=st.data())
def test_torch_gpt_bytes_at_every_phase_boundary_equal_the_accountants_timeline(
        data: st.DataObject, device: str) -> None:
    case = data.draw(gpt_cases("torch", device))
    got, want, where = gaps.boundary_arrays(case, meas.boundary_bytes(case))
    assert len(where) == len(drv.BOUNDARIES) * len(rprof.CATEGORIES)  # nothing skipped
    assert_claim("profile.gpt_boundary_bytes", actual=got, expected=want)


@settings(examples(8), deadline=None)
@given(case=gpt_cases("reference"))
def test_reference_gpt_bytes_at_every_phase_boundary_equal_the_same_timeline_with_no_term(
        case: drv.ProfileCase) -> None:
    got, want, where = gaps.boundary_arrays(case, meas.boundary_bytes(case))
    assert gaps.reference_memory_terms(case) == {}  # no named term to hide behind
    assert len(where) == (len(drv.BOUNDARIES) - 1) * len(rprof.CATEGORIES)  # all compared
    assert_claim("profile.gpt_boundary_bytes", actual=got, expected=want)


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
    assert_claim("profile.gpt_flops", actual=np.array([counted.get(p, 0) for p in phases]),
                 expected=np.array([sheet[p] for p in phases]))


def test_the_sheets_forward_flops_are_the_reference_tapes_own_gemm_count() -> None:
    from reference import accounting_gpt as ragpt

    case = drv.ProfileCase(impl="reference", model="gpt", batch=3)
    run, data, _ = meas.reference_parts(case)
    x, y = data()
    run.model.forward(x, y)
    assert_claim("profile.gpt_flops", actual=np.array([ragpt.gpt_tape_flops(run.model)]),
                 expected=np.array([drv.tree_flops(case)["forward"]]))


@pytest.mark.parametrize(("precision", "recompute"), [("fp32", "none"), ("bf16", "sqrt"),
                                                      ("fp16", "uniform:2")])
def test_the_reference_gpts_own_tape_count_reads_the_same_held_bytes(precision: str,
                                                                     recompute: str) -> None:
    case = drv.ProfileCase(impl="reference", model="gpt", batch=2, precision=precision,
                           recompute=recompute)
    tape = meas.reference_tape_bytes(case)
    formula = gaps.tape_formula(drv.formula_timeline(case))
    assert dict(tape)["forward"] > 0  # the forward's end holds the tape: the edge is reached
    assert_claim("profile.gpt_reference_tape", actual=np.array([v for _, v in tape]),
                 expected=np.array([formula[b] for b, _ in tape]))


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
                 actual=np.array([gaps.saves_mismatches(measured, predicted)]),
                 expected=np.array([0]))


@pytest.mark.parametrize("impl", drv.IMPLS)
def test_gpt_phases_are_disjoint_ordered_intervals_inside_each_step(impl: str,
                                                                    device: str) -> None:
    case = drv.ProfileCase(impl=impl, model="gpt", batch=2, recompute="sqrt",
                           device=device if impl == "torch" else "cpu")
    phases = tuple(p for p in drv.BOUNDARIES[1:] if impl == "torch" or p != "host-to-device")
    steps = meas.timed_steps(case, 3)
    faults = [meas.interval_faults(s, phases) for s in steps]
    assert_claim("profile.phase_intervals",
                 actual=np.array([len(f) for f in faults], dtype=np.int64),
                 expected=np.zeros(len(steps), dtype=np.int64))


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
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


@pytest.mark.parametrize(("blas", "named"), [("1", "waiting for a core"),
                                             (None, "waiting for a core or for BLAS's threads")])
def test_the_off_cpu_term_names_blas_threads_unless_they_are_pinned_to_one(
        blas: str | None, named: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    if blas is not None:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", blas)
    case = drv.ProfileCase(impl="reference", model="gpt", batch=2, steps=4, wait=1, warmup=1,
                           active=2, repeats=1)
    sheet = drv.predict(case, drv.probe_machine(case))
    measured = meas.measure(case, None)
    measured["off_cpu"] = [{k: v + 1e-3 for k, v in o.items()} for o in measured["off_cpu"]]
    rows = gaps.time_rows(case, sheet, measured, drv.predict(drv.with_batch(case, 1),
                                                             sheet["machine"]))
    forward = next(r for r in rows if r["phase"] == "forward")
    assert named in [t["term"] for t in forward["terms"]]  # 1 ms off the CPU: the term exists
