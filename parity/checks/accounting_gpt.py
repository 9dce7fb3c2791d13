"""Quick checks of the transformer's accounting claims: a fixed grid of steps of the compact
transformer through parity/drivers/accounting_gpt.py (observed = the count of differing
integers)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from parity.checks.accounting import PHASES, STATE, _mismatches
from parity.drivers import accounting as drv
from parity.drivers import accounting_gpt as dgpt
from parity.report import Observation, check
from reference import flops as rflops

BASE = drv.GPTCase(n_layer=2, d_model=12, n_head=3, seq_len=6, block_size=8, vocab=10,
                   batch=2, precision="fp32", optimizer="adamw")
GRID = [dataclasses.replace(BASE, precision=p, recompute=r, dropout=d)
        for p, r, d in itertools.product(("fp32", "bf16", "fp16"), rflops.RECOMPUTE, (0.0, 0.2))]
ACTIVATIONS = ("activations: model", "activations: loss", "activations: GradScaler")


def _phases(case: drv.GPTCase) -> list[int]:
    p = rflops.transformer_phase_flops(**case.shape(), recompute=case.recompute,  # type: ignore[arg-type]
                                       dropout=case.dropout)
    return [p[k] for k in PHASES]


def _rows(case: drv.GPTCase, names: tuple[str, ...]) -> list[int]:
    by_name = {r.name: r.predicted for r in dgpt.gpt_sheet(case)}
    return [by_name[n] for n in names]  # type: ignore[misc]


@check("accounting.gpt_flops")
def _() -> Observation:
    bad, n = 0.0, 0
    for case in GRID:
        for fl in (dgpt.torch_gpt_step(case)["flops"], dgpt.meta_flops(case)):
            measured = [fl[k] for k in PHASES]  # type: ignore[index]
            bad, n = bad + _mismatches("accounting.gpt_flops", measured, _phases(case)), n + 4
    small = drv.GPTCase(precision="fp32", recompute="full_early_stop")  # GPT-2 small's shape
    fl = dgpt.meta_flops(small)
    bad += _mismatches("accounting.gpt_flops", [fl[k] for k in PHASES], _phases(small))
    return Observation(bad, n + 4, "3 precisions x 3 recomputes x dropout on/off, CPU and "
                                   "meta; GPT-2 small on meta")


@check("accounting.gpt_sdpa_flops")
def _() -> Observation:
    bad, n = 0.0, 0
    for recompute in rflops.RECOMPUTE:
        case = dataclasses.replace(BASE, recompute=recompute)
        att = rflops.transformer_forward_flops(**case.shape())["attention"]  # type: ignore[arg-type]
        missing = [att, 2 * att, att if recompute != "none" else 0, 0]
        cpu = [dgpt.sdpa_flops(case)[k] for k in PHASES]
        meta = [dgpt.sdpa_flops(case, "meta")[k] for k in PHASES]
        expected = _phases(case)
        bad += _mismatches("accounting.gpt_sdpa_flops", cpu + meta,
                           [e - m for e, m in zip(expected, missing, strict=True)] + expected)
        n += 8
    return Observation(bad, n, "3 recomputes, CPU (attention counts 0) and meta (dense)")


@check("accounting.gpt_tape_flops")
def _() -> Observation:
    bad, n = 0.0, 0
    for case, dtype in itertools.product(GRID[:2], (np.float32, np.float64)):
        case = dataclasses.replace(case, precision="fp32", recompute="none")
        forward = rflops.transformer_forward_flops(**case.shape())["total"]  # type: ignore[arg-type]
        mine = dgpt.reference_gpt_step(case, dtype)["tape_forward"]
        bad, n = bad + _mismatches("accounting.gpt_tape_flops", [mine], [forward]), n + 1  # type: ignore[list-item]
    return Observation(bad, n, "dropout on/off x float32/float64")


@check("accounting.gpt_state_bytes")
def _() -> Observation:
    bad, n = 0.0, 0
    for optimizer, tie in itertools.product(drv.OPTIMIZERS, (False, True)):
        case = dataclasses.replace(BASE, optimizer=optimizer, tie_weights=tie, precision="bf16")
        predicted = _rows(case, STATE)
        for state in (dgpt.torch_gpt_step(case)["state"], dgpt.reference_gpt_step(case)["state"]):
            measured = [state.get(k, 0) for k in STATE]  # type: ignore[union-attr]
            bad, n = bad + _mismatches("accounting.gpt_state_bytes", measured, predicted), n + 6
    return Observation(bad, n, "4 optimizers x tied/untied head, both trees")


@check("accounting.gpt_activation_bytes")
def _() -> Observation:
    bad, n = 0.0, 0
    for case in GRID:
        predicted = _rows(case, ACTIVATIONS)
        held = dgpt.torch_gpt_step(case)["held"]
        measured = [held[k] for k in ("model", "loss", "other")]  # type: ignore[index]
        bad, n = bad + _mismatches("accounting.gpt_activation_bytes", measured, predicted), n + 3
        tape = dgpt.reference_gpt_step(case)["held"]
        if tape is not None:
            mine = [tape["model"], tape["loss"]]  # type: ignore[index]
            bad = bad + _mismatches("accounting.gpt_activation_bytes", mine, predicted[:2])
            n += 2
    return Observation(bad, n, "3 precisions x 3 recomputes x dropout on/off (torch); the "
                               "reference tape in fp32 without recompute")
