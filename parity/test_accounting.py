"""Memory and FLOP accounting, three ways: the formulas (reference/accounting.py,
reference/accounting_gpt.py, reference/flops.py), torch's own counters
(torch_impl/accounting.py: the optimizer's state, saved_tensors_hooks, FlopCounterMode) and
the reference's own arrays, tape and counters, on one training step of the compact MLP and
of the compact transformer (that one: parity/test_accounting_gpt.py). Every comparison is of
integers, exactly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import event, example, given, settings

from parity.compare import assert_claim
from parity.drivers import accounting as drv
from parity.strategies import examples
from parity.strategies.accounting import (
    ACCOUNTING_OPTIMIZERS,
    ACCOUNTING_PRECISIONS,
    accounting_mlp_cases,
)
from reference import accounting as racc
from reference import flops as rflops
from reference import nn as rnn
from reference.recompute import parse_schedule
from torch_impl import accounting as tacc
from torch_impl import nn as tnn


def test_a_tanh_mlp_holds_the_formulas_bytes_in_torchs_hooks_and_the_reference_tape(
        device: str) -> None:
    """One forward and loss of a tanh MLP: the bytes held for backward (model, loss) are
    mlp_activation_bytes and loss_saved's by the formula, what torch's saved_tensors_hooks
    see (StepMeter) and what the reference's tape holds."""
    sizes, batch = (4, 6, 6, 3), 5
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 4)).astype(np.float32)  # (N, d_in)
    y = rng.integers(0, 3, batch)  # (N,) int64 classes
    kind = torch.device(device).type
    predicted = np.array([racc.mlp_activation_bytes(sizes, batch, activation="tanh", device=kind),
                          racc.held_bytes(racc.loss_saved(batch, 3))])
    ref_model, ref_loss_fn = rnn.make_mlp(sizes, "tanh", rng=rng), rnn.CrossEntropyLoss()
    ref_loss_fn(ref_model.forward(x), y)
    # + 4: nll_loss's 0-dim float32 total_weight, which torch saves and the reference lacks
    ref_held = np.array([racc.tape_bytes(ref_model.modules()), racc.tape_bytes([ref_loss_fn]) + 4])
    torch_model = tnn.make_mlp(sizes, "tanh", generator=torch.Generator(), device=device)
    torch_loss_fn = torch.nn.CrossEntropyLoss()
    with tacc.StepMeter(torch_model, loss_fn=torch_loss_fn, device=device) as meter:
        torch_loss_fn(torch_model(torch.from_numpy(x).to(device)), torch.from_numpy(y).to(device))
    torch_held = np.array([meter.held("model"), meter.held("loss")])
    saved, _ = racc.mlp_saved(sizes, batch, activation="tanh")
    assert predicted[0] < sum(e.nbytes for e in saved)  # a Tanh's result and the next input: once
    assert_claim("accounting.activation_bytes", actual=torch_held, expected=predicted,
                 context="torch")
    assert_claim("accounting.activation_bytes", actual=ref_held, expected=predicted,
                 context="reference")


# A schedule whose segments end in a Linear: torch's early stop cuts those GEMMs
CUT = {"sizes": (4, 6, 6, 3), "batch": 3, "activation": "tanh", "dropout": 0.0,
       "precision": "bf16", "optimizer": "adam", "recompute": "uniform:3", "early_stop": True,
       "seed": 1}


def _events(case: drv.MLPCase) -> None:
    n = len(rflops.mlp_layers(case.sizes, case.activation, case.dropout))
    _, cut = rflops.recompute_runs(parse_schedule(case.recompute, n).plan, [True] * n,
                                   case.early_stop)
    event("early stop cuts a GEMM" if sum(cut.values()) else "no cut")
    event(f"recompute {case.recompute.partition(':')[0]}")
    event(f"precision {case.precision}")
    event("dropout p = 1 (0-dim mask)" if case.dropout == 1.0 else f"dropout {case.dropout > 0}")


@pytest.mark.parametrize("optimizer", ACCOUNTING_OPTIMIZERS)
@pytest.mark.parametrize("precision", ACCOUNTING_PRECISIONS)
def test_training_state_bytes_equal_the_formula_in_both_trees(precision: str, optimizer: str,
                                                              device: str) -> None:
    """training_memory (autocast: fp32 weights, no master) + Adam's step == the bytes of
    torch's and the reference's parameters, gradients and optimizer state after one step."""
    case = drv.MLPCase(precision=precision, optimizer=optimizer, activation="gelu")
    predicted = drv.predicted(drv.predict_mlp(case), drv.STATE)
    mine = drv.reference_step(case)["state"]
    theirs = drv.torch_step(case, device)
    assert not theirs["skipped"], "the step was skipped: the optimizer state was never created"
    assert_claim("accounting.state_bytes", actual=drv.measured(theirs["state"], drv.STATE),
                 expected=predicted, context=f"(torch, {precision}, {optimizer})")
    assert_claim("accounting.state_bytes", actual=drv.measured(mine, drv.STATE), expected=predicted,
                 context=f"(reference, {precision}, {optimizer})")


@pytest.mark.parametrize("optimizer", ACCOUNTING_OPTIMIZERS)
def test_formula_precisions_and_project_precisions_map_both_ways(optimizer: str) -> None:
    """Each formula setting (precision, master_weights) describes exactly the torch setups
    project_precisions / memory_arguments say: autocast runs measure as ('fp32', no master),
    2-byte weights (bf16 or fp16: bytes do not tell them apart) with float32 copies as
    '*_mixed' with a master, without as '*_mixed' without one; no other setup matches."""
    case = drv.MLPCase(optimizer=optimizer, activation="relu")
    # setup -> (measured state, (bytes of a weight, master) of the formula it realizes)
    setups: dict[str, tuple[dict[str, int], tuple[int, bool]]] = {}
    for p in ACCOUNTING_PRECISIONS:
        args = racc.memory_arguments(p)
        setups[f"autocast {p}"] = (drv.torch_step(dataclasses.replace(case, precision=p))[
            "state"], (racc.PRECISIONS[str(args["precision"])], bool(args["master_weights"])))
    for lp in ("bf16", "fp16"):
        for master in (True, False):
            setups[f"{lp} weights, master {master}"] = (
                drv.torch_low_precision_weights_step(case, lp, master),
                (racc.PRECISIONS[f"{lp}_mixed"], master))
    n, tensors = case.n_params, racc.mlp_param_tensors(case.sizes)
    step = racc.optimizer_step_bytes(optimizer, tensors)
    for precision in racc.PRECISIONS:
        for master in (False, True) if precision != "fp32" else (False,):
            mem = racc.training_memory(n, optimizer=optimizer, precision=precision,
                                       master_weights=master)
            formula = np.array([mem[k] for k in drv.STATE[:-1]] + [step], dtype=np.int64)
            matching = np.array([np.array_equal(drv.measured(state, drv.STATE), formula)
                                 for state, _ in setups.values()], dtype=np.int64)
            declared = np.array([mapping == (racc.PRECISIONS[precision], master)
                                 for _, mapping in setups.values()], dtype=np.int64)
            projects = {f"autocast {p}" for p in racc.project_precisions(precision, master)}
            inverse = np.array([name in projects for name in setups], dtype=np.int64)
            autocast = np.array([name.startswith("autocast") for name in setups])
            assert declared.any(), f"no setup realizes ({precision}, master {master})"
            assert_claim("accounting.state_bytes", actual=matching, expected=declared,
                         context=f"(setups {list(setups)} against ({precision}, master {master}))")
            assert_claim("accounting.state_bytes", actual=inverse, expected=declared * autocast,
                         context=f"(project_precisions({precision!r}, {master}))")


@given(fields=accounting_mlp_cases())
@example(fields=CUT)
@settings(examples(15))
def test_flop_counter_equals_mlp_flops_per_phase(fields: dict, device: str) -> None:
    """FlopCounterMode over one torch step, by phase (forward, backward, recompute,
    optimizer) == mlp_flops, any precision, schedule, early stop, dropout; on meta too."""
    case = drv.MLPCase(**fields)
    _events(case)
    predicted = drv.predicted(drv.predict_mlp(case), drv.PHASES)
    measured = drv.torch_step(case, device)["flops"]
    assert_claim("accounting.flops", actual=drv.measured(measured, drv.PHASES), expected=predicted,
                 context=f"({case})")
    meta = drv.torch_meta_flops(case)
    assert_claim("accounting.flops", actual=drv.measured(meta, drv.PHASES), expected=predicted,
                 context=f"(meta, {case})")


@pytest.mark.parametrize("recompute", ["none", "sqrt", "optimal:2"])
def test_flop_counter_on_meta_counts_an_mlp_too_large_to_allocate(recompute: str) -> None:
    """An MLP of 5.4 billion parameters (21 GB in float32) on 8192 rows: counted on the
    meta device, equal to mlp_flops, without allocating a byte of it."""
    case = drv.MLPCase(sizes=(8192, 65536, 65536, 8192), batch=8192, activation="gelu",
                       recompute=recompute)
    assert 4 * case.n_params > 16 * 2**30  # counted on meta, never allocated
    predicted = drv.predicted(drv.predict_mlp(case), drv.PHASES)
    assert_claim("accounting.flops", actual=drv.measured(drv.torch_meta_flops(case), drv.PHASES),
                 expected=predicted, context=f"({recompute})")


@given(fields=accounting_mlp_cases())
@example(fields=CUT)
@settings(examples(30))
def test_reference_counts_its_own_gemms_and_the_two_named_terms(fields: dict) -> None:
    """The reference's forward (tape shapes and counters), backward and recompute GEMMs ==
    mlp_flops + the first Linear's dx + the GEMMs torch's early stop cuts (float32)."""
    case = drv.MLPCase(**{**fields, "precision": "fp32"})
    _events(case)
    predicted = rflops.mlp_flops(case.sizes, case.batch, activation=case.activation,
                                 dropout=case.dropout, recompute=case.recompute,
                                 early_stop=case.early_stop)
    mine = drv.reference_step(case)
    fl = mine["flops"]
    cut = fl["cut"] if case.early_stop else 0  # type: ignore[index]
    measured = [fl["forward"], fl["backward"] - drv.first_dx(case),  # type: ignore[index]
                fl["recompute"] - cut]  # type: ignore[index]
    expected = [predicted["forward"], predicted["backward"], predicted["recompute"]]
    if mine["tape_forward"] is not None:
        measured.append(mine["tape_forward"])
        expected.append(predicted["forward"])
    assert_claim("accounting.tape_flops", actual=np.array(measured), expected=np.array(expected),
                 context=f"({case})")


@given(fields=accounting_mlp_cases())
@settings(examples(15))
def test_held_bytes_equal_the_formula_torch_hooks_and_the_reference_tape(fields: dict,
                                                                        device: str) -> None:
    """saved_tensors_hooks' distinct bytes for the model, the loss and fp16's scaler ==
    mlp_activation_bytes, loss_saved, 4; the reference tape (every precision: 2-byte lp
    arrays under autocast) the same, minus its two named terms (nll_loss's total_weight,
    the scale) and plus one (the first Linear's weight cast it keeps for dx)."""
    case = drv.MLPCase(**fields)
    _events(case)
    regions = ("activations: model", "activations: loss", "activations: GradScaler")
    predicted = drv.predicted(drv.predict_mlp(case, device), regions)
    held = drv.torch_step(case, device)["held"]
    theirs = np.array([held["model"], held["loss"], held["other"]], dtype=np.int64)  # type: ignore[index]
    assert_claim("accounting.activation_bytes", actual=theirs, expected=predicted,
                 context=f"(torch, {case})")
    event(f"the reference keeps a first weight cast: {drv.first_weight_cast(case) > 0}")
    tape = drv.reference_step(case)["held"]
    mine = np.array([tape["model"] - drv.first_weight_cast(case), tape["loss"] + 4,  # type: ignore[index]
                     tape["other"] + drv.scaler_saved(case)], dtype=np.int64)  # type: ignore[index]
    assert_claim("accounting.activation_bytes", actual=mine, expected=predicted,
                 context=f"(reference, {case})")


@pytest.mark.parametrize("recompute", ["none", "uniform:2", "optimal:1"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_float64_models_hold_the_formulas_bytes_in_both_trees(activation: str,
                                                              recompute: str) -> None:
    """A float64 make_mlp (itemsize 8) forward: torch's hooks == the reference tape ==
    mlp_activation_bytes(itemsize=8)."""
    case = drv.MLPCase(sizes=(5, 9, 7, 3), batch=6, activation=activation, dropout=0.5,
                       recompute=recompute)
    theirs, mine = drv.held_forward(case, "float64")
    predicted = racc.mlp_activation_bytes(case.sizes, case.batch, activation=activation,
                                          dropout=case.dropout, itemsize=8, recompute=recompute)
    assert_claim("accounting.activation_bytes", actual=np.array([theirs, mine]),
                 expected=np.array([predicted, predicted]), context=f"({activation}, {recompute})")
