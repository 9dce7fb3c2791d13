"""Quick checks of the train claims for `python -m parity report` (drivers:
parity/drivers/train.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from parity.compare import measure
from parity.drivers.train import (
    KILL_OPTIONS,
    SMALL,
    compare_runs,
    interrupted,
    kill_at,
    one_thread,
    run_to_end,
    uninterrupted,
)
from parity.report import Observation, check
from parity.tolerances import claim
from reference import train as ref_train


@check("train.resume_exact")
def _() -> Observation:
    with one_thread():
        worst, n = _resume_exact_cases()
    return Observation(worst, n, "both impls x {fp32, bf16, fp16 with skipped steps}, "
                                 "dropout 0.2, interrupted at step 4 of 8")


def _resume_exact_cases() -> tuple[float, int]:
    worst, n = 0.0, 0
    for name in ("reference", "torch"):
        for precision in ("fp32", "bf16", "fp16"):
            cfg = {**SMALL, "precision": precision, "init_scale": 2.0**20,
                   "growth_interval": 3}
            with tempfile.TemporaryDirectory() as tmp:
                w, k = compare_runs(interrupted(name, cfg, 4, 8, Path(tmp)),
                                    uninterrupted(name, cfg, 8))
            worst, n = worst + w, n + k
    return worst, n


@check("train.digest_cross_impl")
def _() -> Observation:
    from torch_impl import resume as t_resume
    from torch_impl import train as t_train

    worst, n = 0.0, 0
    for precision in ("fp32", "fp16"):
        state = uninterrupted("reference", {**SMALL, "precision": precision}, 7)
        a = bytes.fromhex(t_train.state_digest(t_resume.state_from_reference(state)))
        b = bytes.fromhex(ref_train.state_digest(state))
        worst += measure(claim("train.digest_cross_impl"), np.frombuffer(a, np.uint8),
                         np.frombuffer(b, np.uint8))
        n += 1
    return Observation(worst, n, "reference states after 7 steps, fp32 and fp16")


@check("train.kill_resume")
def _() -> Observation:
    with tempfile.TemporaryDirectory() as tmp:
        expected, _ = run_to_end("reference", Path(tmp) / "a", 30, KILL_OPTIONS)
        directory = Path(tmp) / "b"
        kills = sum(kill_at("reference", directory, 30, KILL_OPTIONS, delay=d)
                    for d in (0.35, 0.45))
        actual, _ = run_to_end("reference", directory, 30, KILL_OPTIONS)
    observed = measure(claim("train.kill_resume"), np.frombuffer(bytes.fromhex(actual), np.uint8),
                       np.frombuffer(bytes.fromhex(expected), np.uint8))
    return Observation(observed, 1, f"reference fp16, {kills} SIGKILLs, then --resume")


