"""Memory and FLOP accounting, three ways: the formulas (reference/accounting.py,
reference/accounting_gpt.py, reference/flops.py), torch's own counters
(torch_impl/accounting.py: the optimizer's state, saved_tensors_hooks, FlopCounterMode) and
the reference's own arrays, tape and counters, on one training step of the compact MLP and
of the compact transformer. Every comparison is of integers, exactly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import event, example, given, settings

from parity.compare import assert_claim
from parity.drivers import accounting as drv
from parity.drivers import accounting_gpt as dgpt
from parity.strategies import examples
from parity.strategies.accounting import (
    ACCOUNTING_OPTIMIZERS,
    ACCOUNTING_PRECISIONS,
    accounting_gpt_cases,
    accounting_mlp_cases,
)
from reference import accounting as racc
from reference import accounting_gpt as ragpt
from reference import flops as rflops
from reference import nn as rnn
from reference.recompute import parse_schedule
from torch_impl import accounting as tacc
from torch_impl import nn as tnn

STATE = ("weights", "grads", "master", "grad_buffer", "optimizer_state", "optimizer_step")
PHASES = ("forward", "backward", "recompute", "optimizer")


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


def _predicted(rows: list[drv.Row], names: tuple[str, ...]) -> np.ndarray:
    by_name = {r.name: r.predicted for r in rows}
    return np.array([by_name[n] for n in names], dtype=np.int64)


def _measured(state: dict[str, int], names: tuple[str, ...]) -> np.ndarray:
    return np.array([state.get(n, 0) for n in names], dtype=np.int64)


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
    predicted = _predicted(drv.predict_mlp(case), STATE)
    mine = drv.reference_step(case)["state"]
    theirs = drv.torch_step(case, device)
    assert not theirs["skipped"], "the step was skipped: the optimizer state was never created"
    assert_claim("accounting.state_bytes", actual=_measured(theirs["state"], STATE),
                 expected=predicted, context=f"(torch, {precision}, {optimizer})")
    assert_claim("accounting.state_bytes", actual=_measured(mine, STATE), expected=predicted,
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
            formula = np.array([mem[k] for k in STATE[:-1]] + [step], dtype=np.int64)
            matching = np.array([np.array_equal(_measured(state, STATE), formula)
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
    predicted = _predicted(drv.predict_mlp(case), PHASES)
    measured = drv.torch_step(case, device)["flops"]
    assert_claim("accounting.flops", actual=_measured(measured, PHASES), expected=predicted,
                 context=f"({case})")
    meta = drv.torch_meta_flops(case)
    assert_claim("accounting.flops", actual=_measured(meta, PHASES), expected=predicted,
                 context=f"(meta, {case})")


@pytest.mark.parametrize("recompute", ["none", "sqrt", "optimal:2"])
def test_flop_counter_on_meta_counts_an_mlp_too_large_to_allocate(recompute: str) -> None:
    """An MLP of 5.4 billion parameters (21 GB in float32) on 8192 rows: counted on the
    meta device, equal to mlp_flops, without allocating a byte of it."""
    case = drv.MLPCase(sizes=(8192, 65536, 65536, 8192), batch=8192, activation="gelu",
                       recompute=recompute)
    assert 4 * case.n_params > 16 * 2**30  # counted on meta, never allocated
    predicted = _predicted(drv.predict_mlp(case), PHASES)
    assert_claim("accounting.flops", actual=_measured(drv.torch_meta_flops(case), PHASES),
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
    predicted = _predicted(drv.predict_mlp(case, device), regions)
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


# ---------------------------------------------------------------- the compact transformer
# dropout 0 with full_early_stop: the early stop skips every block's mlp.c_proj GEMM
EARLY = {"n_layer": 2, "d_model": 6, "n_head": 2, "seq_len": 5, "block_size": 7, "vocab": 9,
         "batch": 2, "tie_weights": False, "dropout": 0.0, "precision": "bf16",
         "optimizer": "adamw", "recompute": "full_early_stop"}


def _gpt_events(case: drv.GPTCase) -> None:
    skips = case.recompute == "full_early_stop" and case.dropout == 0
    event("early stop skips mlp.c_proj" if skips else f"recompute {case.recompute}")
    event(f"precision {case.precision}, dropout {case.dropout > 0}")
    event("seq_len < block_size" if case.seq_len < (case.block_size or 0) else "full block")


def _gpt_phases(case: drv.GPTCase) -> np.ndarray:
    p = rflops.transformer_phase_flops(**case.shape(), recompute=case.recompute,  # type: ignore[arg-type]
                                       dropout=case.dropout)
    return np.array([p[k] for k in PHASES], dtype=np.int64)


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@given(fields=accounting_gpt_cases())
@example(fields=EARLY)
@settings(examples(8), deadline=None)
def test_flop_counter_equals_transformer_flops_per_phase_for_every_recompute(fields: dict,
                                                                           device: str) -> None:
    """FlopCounterMode over one torch train_step of the GPT, by phase == transformer_phase_
    flops (none, full without early stop, full_early_stop); the meta model counts the same."""
    case = drv.GPTCase(**fields)
    _gpt_events(case)
    fl = dgpt.torch_gpt_step(case, device)["flops"]
    assert_claim("accounting.gpt_flops", actual=_measured(fl, PHASES), expected=_gpt_phases(case),
                 context=f"(torch, {case})")
    assert_claim("accounting.gpt_flops", actual=_measured(dgpt.meta_flops(case), PHASES),
                 expected=_gpt_phases(case), context=f"(meta, {case})")


GPT2 = {"small": (12, 768, 12), "medium": (24, 1024, 16)}


@pytest.mark.parametrize("size", [
    "small", pytest.param("medium", marks=pytest.mark.slow)])
@pytest.mark.parametrize("recompute", ["none", "full_early_stop"])
def test_flop_counter_on_meta_counts_gpt2_shapes_without_allocating(size: str,
                                                                   recompute: str) -> None:
    """GPT-2 small / medium (s 1024, V 50257, batch 8) on the meta device: the count by
    phase == transformer_phase_flops; every parameter is a meta tensor (no storage)."""
    n_layer, d_model, n_head = GPT2[size]
    case = drv.GPTCase(n_layer=n_layer, d_model=d_model, n_head=n_head, recompute=recompute,
                       precision="fp32")
    model = dgpt.meta_gpt(dgpt.config_of(case))
    assert all(p.is_meta for p in model.parameters()), "a parameter was allocated"
    fl = dgpt.gpt_flops(model, case, "meta")
    assert_claim("accounting.gpt_flops", actual=_measured(fl, PHASES), expected=_gpt_phases(case),
                 context=f"({size}, {recompute})")


@pytest.mark.parametrize("recompute", ["none", "full_early_stop"])
def test_sdpa_counts_zero_attention_flops_on_cpu_and_dense_on_meta(recompute: str) -> None:
    """attention='sdpa': the CPU count == transformer_phase_flops minus attention's part
    (forward, 2x backward, the re-run blocks' share); the meta count == the formula."""
    case = drv.GPTCase(**{**EARLY, "recompute": recompute})
    attention = rflops.transformer_forward_flops(**case.shape())["attention"]  # type: ignore[arg-type]
    rerun = attention if recompute != "none" else 0
    missing = np.array([attention, 2 * attention, rerun, 0], dtype=np.int64)
    assert attention > 0
    assert_claim("accounting.gpt_sdpa_flops", actual=_measured(dgpt.sdpa_flops(case), PHASES),
                 expected=_gpt_phases(case) - missing, context=f"(cpu, {recompute})")
    assert_claim("accounting.gpt_sdpa_flops",
                 actual=_measured(dgpt.sdpa_flops(case, "meta"), PHASES),
                 expected=_gpt_phases(case), context=f"(meta, {recompute})")


@given(fields=accounting_gpt_cases())
@settings(examples(25), deadline=None)
def test_reference_tape_counts_the_transformers_forward_gemms(fields: dict) -> None:
    """The reference GPT's tape (Linear inputs, the core's q, k^T, att, v) after a forward
    == transformer_forward_flops, float32 and float64."""
    case = drv.GPTCase(**{**fields, "precision": "fp32", "recompute": "none"})
    forward = rflops.transformer_forward_flops(**case.shape())["total"]  # type: ignore[arg-type]
    counts = [dgpt.reference_gpt_step(case, dtype)["tape_forward"]
              for dtype in (np.float32, np.float64)]
    assert_claim("accounting.gpt_tape_flops", actual=np.array(counts, dtype=np.int64),
                 expected=np.array([forward, forward], dtype=np.int64), context=f"({case})")


@given(fields=accounting_gpt_cases())
@settings(examples(6), deadline=None)
def test_gpt_training_state_bytes_equal_the_formula_in_both_trees(fields: dict,
                                                                  device: str) -> None:
    """training_memory('fp32', no master) + Adam's step per tensor == the bytes of torch's
    and the reference's parameters, gradients and optimizer state after one GPT step."""
    case = drv.GPTCase(**fields)
    _gpt_events(case)
    predicted = _predicted(dgpt.gpt_sheet(case), STATE)
    theirs = dgpt.torch_gpt_step(case, device)
    assert not theirs["skipped"], "the step was skipped: the optimizer state was never created"
    mine = dgpt.reference_gpt_step(case)["state"]
    assert_claim("accounting.gpt_state_bytes", actual=_measured(theirs["state"], STATE),
                 expected=predicted, context=f"(torch, {case})")
    assert_claim("accounting.gpt_state_bytes", actual=_measured(mine, STATE), expected=predicted,
                 context=f"(reference, {case})")


@given(fields=accounting_gpt_cases())
@example(fields=EARLY)
@example(fields={**EARLY, "precision": "fp32", "recompute": "none", "dropout": 0.25})
@settings(examples(8), deadline=None)
def test_gpt_held_bytes_equal_the_formula_torch_hooks_and_the_reference_tape(
        fields: dict, device: str) -> None:
    """saved_tensors_hooks' distinct bytes for the model, the loss and fp16's scaler ==
    gpt_activation_bytes' rows; the reference tape (fp32, no recompute) the same."""
    case = drv.GPTCase(**fields)
    if device != "cpu":  # CUDA autocast (softmax in float32) is not modelled: gpt_saved says so
        case = dataclasses.replace(case, precision="fp32")
    _gpt_events(case)
    regions = ("activations: model", "activations: loss", "activations: GradScaler")
    predicted = _predicted(dgpt.gpt_sheet(case, device), regions)
    held = dgpt.torch_gpt_step(case, device)["held"]
    theirs = np.array([held[k] for k in ("model", "loss", "other")], dtype=np.int64)  # type: ignore[index]
    assert_claim("accounting.gpt_activation_bytes", actual=theirs, expected=predicted,
                 context=f"(torch, {case})")
    tape = dgpt.reference_gpt_step(case)["held"]
    if tape is not None:
        mine = np.array([tape["model"], tape["loss"]], dtype=np.int64)  # type: ignore[index]
        assert_claim("accounting.gpt_activation_bytes", actual=mine, expected=predicted[:2],
                     context=f"(reference, {case})")


@pytest.mark.parametrize(("precision", "dropout", "dtype"), [
    ("fp32", 0.0, "float32"), ("fp32", 0.25, "float64"), ("bf16", 0.25, "float32"),
    ("fp16", 0.0, "float32")])
def test_gpt_saved_lists_torchs_saves_one_for_one(precision: str, dropout: float,
                                                  dtype: str) -> None:
    """gpt_saved's (module, node attribute, bytes) == measure_saved's entries as multisets,
    and its distinct bytes == the hooks' distinct storages; float64 in both trees."""
    import collections

    import torch

    from torch_impl import gpt as tgpt
    from torch_impl.amp import autocast_dtype

    case = drv.GPTCase(**{**EARLY, "precision": precision, "dropout": dropout,
                          "recompute": "none"})
    config = dgpt.config_of(case)
    model = tgpt.GPT(config, generator=torch.Generator().manual_seed(0),
                     dtype=getattr(torch, dtype))
    idx, targets = (torch.from_numpy(a) for a in dgpt.tokens(case))
    lp = autocast_dtype(precision)
    with torch.autocast("cpu", dtype=lp, enabled=lp is not None):
        entries, held = tgpt.measure_saved(model, idx, targets)
    shape = {k: v for k, v in case.shape().items() if k != "d_ff"}
    saved, _ = ragpt.gpt_saved(**shape, dropout=dropout, precision=precision,  # type: ignore[arg-type]
                               itemsize=np.dtype(dtype).itemsize)
    theirs = collections.Counter((e.module, e.name, e.nbytes) for e in entries)
    ours = collections.Counter((str(s.layer), s.name, s.nbytes) for s in saved)
    keys = sorted(theirs.keys() | ours.keys())
    assert_claim("accounting.gpt_activation_bytes",
                 actual=np.array([theirs[k] for k in keys] + [held], dtype=np.int64),
                 expected=np.array([ours[k] for k in keys] + [racc.held_bytes(saved)],
                                   dtype=np.int64),
                 context=f"({precision}, dropout {dropout}, {dtype}; entries {keys})")


def test_committed_gpt_reconciliation_is_what_a_fresh_step_measures() -> None:
    """docs/data/accounting_gpt.json's first case (the docs' table) == measuring it now:
    every predicted and measured integer (the committed file cannot drift from the code)."""
    import json

    committed = json.loads(dgpt.DATA.read_text())["cases"][0]
    assert committed["config"] == dataclasses.asdict(dgpt.RECONCILED[0])
    fresh = dgpt.reconciliation(dgpt.RECONCILED[0])

    def numbers(case: dict) -> list[int]:
        return [-1 if v is None else v for r in case["rows"]
                for v in (r["predicted"], r["measured"]["torch"], r["measured"]["reference"])]

    assert_claim("accounting.gpt_activation_bytes", actual=np.array(numbers(committed)),
                 expected=np.array(numbers(fresh)),
                 context="(docs/data/accounting_gpt.json, case 0)")
