"""Quick checks of the resume claims for `python -m parity report` (drivers:
parity/drivers/resume.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from parity.compare import measure
from parity.drivers.resume import (
    CASES,
    CONTAINER_CASES,
    OPTIMIZERS,
    SCHEDULES,
    compare_states,
    crafted_outcomes,
    reference_state,
    through_reference,
    through_torch,
)
from parity.report import Observation, check
from parity.tolerances import claim


@check("resume.cross_impl_state")
def _() -> Observation:
    worst, n = 0.0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for optimizer, schedule in zip(OPTIMIZERS, SCHEDULES, strict=True):
            state = reference_state(optimizer, schedule, steps=5, seed=1)
            there_and_back = through_torch(through_reference(state, Path(tmp)), Path(tmp))
            w, k = compare_states("resume.cross_impl_state", there_and_back, state)
            worst, n = max(worst, w), n + k
    return Observation(worst, n, "SGD/StepLR, Adam(amsgrad)/Cosine, AdamW/Linear, 5 steps")


@check("resume.crafted_refused")
def _() -> Observation:
    worst, n = 0.0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in (*CASES, *CONTAINER_CASES):
            codes = crafted_outcomes(case, Path(tmp))
            worst += measure(claim("resume.crafted_refused"), codes["actual"], codes["expected"])
            n += 2
    return Observation(worst, n, f"{len(CASES) + len(CONTAINER_CASES)} crafted files x 2 trees")


@check("resume.cross_impl_resume")
def _() -> Observation:
    from parity.drivers.train import cross_impl_resume, one_thread

    worst, n = 0.0, 0
    with one_thread():
        for writer, reader in (("reference", "torch"), ("torch", "reference")):
            with tempfile.TemporaryDirectory() as tmp:
                for _, actual, expected in cross_impl_resume(writer, reader, Path(tmp)):
                    worst += measure(claim("resume.cross_impl_resume"), actual, expected)
                    n += 1
    return Observation(worst, n, "both directions, checkpoint at step 5, continued to 9")
