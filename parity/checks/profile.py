"""Quick checks of the profile claims for `python -m parity report`: a small grid of MLP
steps through parity/drivers/profile_measure.py, observed = the count of differing integers
(bytes at the boundaries, order violations of the clock, saved tensors' shapes and bytes)."""

from __future__ import annotations

import itertools

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
    for impl, precision in (("torch", "fp32"), ("torch", "bf16"), ("torch", "fp16"),
                            ("reference", "fp32")):
        case = drv.ProfileCase(impl=impl, precision=precision, **SMALL)
        predicted = drv.predict(case, drv.NO_MACHINE)["layer"]["saves"]
        bad += gaps.saves_mismatches(meas.layer_saves(case), predicted)
        n += len(predicted)
    return Observation(bad, n, "the second Linear; torch fp32/bf16/fp16, reference fp32")
