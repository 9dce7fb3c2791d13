"""Quick checks of the resume claims for `python -m parity report` (drivers:
parity/drivers/resume.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from parity.drivers.resume import (
    OPTIMIZERS,
    SCHEDULES,
    compare_states,
    reference_state,
    through_reference,
    through_torch,
)
from parity.report import Observation, check


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
