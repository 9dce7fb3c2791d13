"""Memory and FLOP accounting of the compact transformer, three ways: the formulas
(reference/accounting_gpt.py, reference/flops.py), torch's own counters
(torch_impl/accounting.py: saved_tensors_hooks, FlopCounterMode) and the reference's own
tape and counters, on one training step. Every comparison is of integers, exactly. The
compact MLP's: parity/test_accounting.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import event, example, given, settings

from parity.compare import assert_claim
from parity.drivers import accounting as drv
from parity.drivers import accounting_gpt as dgpt
from parity.drivers.accounting import PHASES, STATE, measured
from parity.strategies import examples
from parity.strategies.accounting import accounting_gpt_cases
from reference import accounting as racc
from reference import accounting_gpt as ragpt
from reference import flops as rflops

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
    assert_claim("accounting.gpt_flops", actual=measured(fl, PHASES), expected=_gpt_phases(case),
                 context=f"(torch, {case})")
    assert_claim("accounting.gpt_flops", actual=measured(dgpt.meta_flops(case), PHASES),
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
    assert_claim("accounting.gpt_flops", actual=measured(fl, PHASES), expected=_gpt_phases(case),
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
    assert_claim("accounting.gpt_sdpa_flops", actual=measured(dgpt.sdpa_flops(case), PHASES),
                 expected=_gpt_phases(case) - missing, context=f"(cpu, {recompute})")
    assert_claim("accounting.gpt_sdpa_flops",
                 actual=measured(dgpt.sdpa_flops(case, "meta"), PHASES),
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
    predicted = drv.predicted(dgpt.gpt_sheet(case), STATE)
    theirs = dgpt.torch_gpt_step(case, device)
    assert not theirs["skipped"], "the step was skipped: the optimizer state was never created"
    mine = dgpt.reference_gpt_step(case)["state"]
    assert_claim("accounting.gpt_state_bytes", actual=measured(theirs["state"], STATE),
                 expected=predicted, context=f"(torch, {case})")
    assert_claim("accounting.gpt_state_bytes", actual=measured(mine, STATE), expected=predicted,
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
    predicted = drv.predicted(dgpt.gpt_sheet(case, device), regions)
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
