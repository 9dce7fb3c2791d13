"""Quick checks of the profile claims for `python -m parity report`: a small grid of MLP
steps through parity/drivers/profile_measure.py, observed = the count of differing integers
(bytes at the boundaries, order violations of the clock, saved tensors' shapes and bytes)."""

from __future__ import annotations

import itertools

import numpy as np

from parity.compare import measure
from parity.drivers import profile as drv
from parity.drivers import profile_gaps as gaps
from parity.drivers import profile_measure as meas
from parity.report import Observation, check
from parity.tolerances import claim

SMALL = {"sizes": (6, 10, 8, 3), "batch": 5, "steps": 10}
GRID = tuple(itertools.product(("fp32", "bf16", "fp16"), ("SGD", "AdamW"), ("none", "sqrt"),
                               (0.0, 0.25)))


def _bytes_mismatches(claim_id: str, impl: str) -> tuple[float, int]:
    bad, n = 0.0, 0
    for precision, optimizer, recompute, dropout in GRID:
        if impl == "reference" and precision != "fp32" and recompute != "none":
            continue  # not composed in the reference (ProfileCase refuses it)
        case = drv.ProfileCase(impl=impl, precision=precision, optimizer=optimizer,
                               recompute=recompute, dropout=dropout, activation="gelu", **SMALL)
        got, want, _ = gaps.boundary_arrays(case, meas.boundary_bytes(case))
        bad += measure(claim(claim_id), got, want)
        n += len(got)
    return bad, n


@check("profile.boundary_bytes")
def _() -> Observation:
    bad, n = _bytes_mismatches("profile.boundary_bytes", "torch")
    return Observation(bad, n, "3 precisions x {SGD, AdamW} x {none, sqrt} x dropout {0, "
                               "0.25}, gelu; 6 boundaries x 5 categories each, CPU")


@check("profile.reference_boundary_bytes")
def _() -> Observation:
    bad, n = _bytes_mismatches("profile.reference_boundary_bytes", "reference")
    return Observation(bad, n, "the torch grid less recompute under bf16/fp16; 5 boundaries "
                               "x 5 categories, the two named terms added")


@check("profile.phase_intervals")
def _() -> Observation:
    bad, n = 0.0, 0
    for impl in drv.IMPLS:
        case = drv.ProfileCase(impl=impl, **SMALL)
        phases = tuple(p for p in drv.BOUNDARIES[1:]
                       if impl == "torch" or p != "host-to-device")
        for step in meas.timed_steps(case, 5):
            bad += len(meas.interval_faults(step, phases))
            n += 1
    return Observation(bad, n, "5 steps per tree; observed = order violations")


@check("profile.saved_tensors")
def _() -> Observation:
    bad, n = 0.0, 0
    for impl, precision, model in (("torch", "fp32", "mlp"), ("torch", "bf16", "mlp"),
                                   ("torch", "fp16", "mlp"), ("reference", "fp32", "mlp"),
                                   ("torch", "bf16", "gpt"), ("reference", "fp16", "gpt")):
        case = drv.ProfileCase(impl=impl, precision=precision, model=model, **SMALL)
        predicted = drv.predict(case, drv.NO_MACHINE)["layer"]["saves"]
        bad += gaps.saves_mismatches(meas.layer_saves(case), predicted)
        n += len(predicted)
    return Observation(bad, n, "the MLP's second Linear: torch fp32/bf16/fp16, reference "
                               "fp32; the transformer's first block: torch bf16, reference fp16")


GPT_GRID = tuple(itertools.product(("fp32", "bf16", "fp16"), ("AdamW",), ("none", "sqrt"),
                                   (0.0, 0.1)))


@check("profile.gpt_boundary_bytes")
def _() -> Observation:
    bad, n = 0.0, 0
    for impl in drv.IMPLS:
        for precision, optimizer, recompute, dropout in GPT_GRID:
            case = drv.ProfileCase(impl=impl, model="gpt", batch=2, precision=precision,
                                   optimizer=optimizer, recompute=recompute, dropout=dropout)
            got, want, _ = gaps.boundary_arrays(case, meas.boundary_bytes(case))
            bad += measure(claim("profile.gpt_boundary_bytes"), got, want)
            n += len(got)
    return Observation(bad, n, "both trees x 3 precisions x {none, sqrt} x dropout {0, 0.1}, "
                               "AdamW, 2 sequences; every boundary and category")


@check("profile.gpt_reference_tape")
def _() -> Observation:
    bad, n = 0.0, 0
    for precision, recompute in (("fp32", "none"), ("bf16", "sqrt"), ("fp16", "uniform:2")):
        case = drv.ProfileCase(impl="reference", model="gpt", batch=2, precision=precision,
                               recompute=recompute)
        tape = meas.reference_tape_bytes(case)
        formula = gaps.tape_formula(drv.formula_timeline(case))
        got = np.array([v for _, v in tape])
        bad += measure(claim("profile.gpt_reference_tape"), got,
                       np.array([formula[b] for b, _ in tape]))
        n += len(tape)
    return Observation(bad, n, "fp32 none, bf16 sqrt, fp16 uniform:2; every boundary")


@check("profile.gpt_flops")
def _() -> Observation:
    from torch_impl import accounting as tacc

    bad, n = 0.0, 0
    for recompute, dropout in itertools.product(("none", "sqrt", "uniform:4", "optimal:2"),
                                                (0.0, 0.1)):
        case = drv.ProfileCase(impl="torch", model="gpt", batch=2, recompute=recompute,
                               dropout=dropout)
        run, data, _ = meas.torch_parts(case)
        x, y = data()
        with tacc.StepMeter(run.model) as meter:
            loss = run.loss_fn(run.model(x), y)
            meter.backward_begins()
            loss.backward()
        counted, sheet = meter.flops.as_dict(), drv.tree_flops(case)
        phases = ("forward", "backward", "recompute")
        bad += measure(claim("profile.gpt_flops"), np.array([counted.get(p, 0) for p in phases]),
                       np.array([sheet[p] for p in phases]))
        n += len(phases)
    return Observation(bad, n, "torch's FlopCounterMode by phase; 4 block schedules x dropout "
                               "{0, 0.1}, 2 sequences")
