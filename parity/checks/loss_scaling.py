"""Quick checks of the loss_scaling claims for `python -m parity report` (drivers:
parity/drivers/loss_scaling.py and loss_scaling_train.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from parity.claims import loss_scaling as lsc
from parity.compare import max_abs_difference, measure
from parity.drivers.loss_scaling import (
    ScalerStreams,
    clip_pair,
    clipped_scale,
    norm_scale,
    random_scales,
    special_grads,
    underflow_grads,
    unscale_pair,
    update_pair,
)
from parity.drivers.loss_scaling_train import loss_reduction, synced_steps
from parity.report import Observation, check
from parity.tolerances import claim

EPS32 = 2.0**-23


@check("loss_scaling.update_rule")
def _() -> Observation:
    rng = np.random.default_rng(0)
    c, worst, n = claim("loss_scaling.update_rule"), 0.0, 0
    for scale in random_scales(rng, 300):
        gi = int(rng.integers(1, 4))
        a, b = update_pair(float(scale), int(rng.integers(0, gi)), float(rng.integers(0, 2)),
                           float(rng.uniform(1.0001, 8)), float(rng.uniform(0.001, 0.9999)), gi)
        worst, n = max(worst, measure(c, a, b)), n + 2
    return Observation(worst, n, "random float32 scales, factors and trackers")


@check("loss_scaling.unscale")
def _() -> Observation:
    rng = np.random.default_rng(1)
    c, worst, n = claim("loss_scaling.unscale"), 0.0, 0
    for scale in random_scales(rng, 40):
        grads = [special_grads(rng, (33,), dt) for dt in (np.float32, np.float64, np.float16)]
        a, b, fa, fb = unscale_pair(grads, float(scale))
        worst = max([worst, float(fa != fb)] + [measure(c, x, y)
                                                for x, y in zip(a, b, strict=True)])
        n += sum(g.size for g in grads)
    return Observation(worst, n, "float16/32/64 gradients with inf/NaN planted")


@check("loss_scaling.scaler")
def _() -> Observation:
    c, seen = claim("loss_scaling.scaler"), {"worst": 0.0, "n": 0}

    class Measured(ScalerStreams):
        def judge(self, label: str, a: Any, b: Any) -> None:
            seen["worst"] = max(seen["worst"], measure(c, a, b))
            seen["n"] += int(np.size(a))

    run_state_machine_as_test(Measured, settings=settings(
        max_examples=3, stateful_step_count=30, deadline=None, derandomize=True,
        database=None, suppress_health_check=list(HealthCheck)))
    return Observation(seen["worst"], seen["n"], "three streams of the scaler state machine")


@check("loss_scaling.clip")
def _() -> Observation:
    rng = np.random.default_rng(4)
    c, worst, n = claim("loss_scaling.clip"), 0.0, 0
    for norm in [0.0, 0.5, 1.0 - 1e-6, 1.0, 3.0, 1e30, float("inf"), float("nan")]:
        grads = [special_grads(rng, (40,), np.float32) for _ in range(3)]
        for foreach in (False, True):
            _, _, a, b = clip_pair(grads, 1.0, norm, foreach)
            worst = max([worst] + [measure(c, x, y) for x, y in zip(a, b, strict=True)])
            n += sum(g.size for g in grads)
    return Observation(worst, n, "8 norms around max_norm 1, finite and non-finite")


@check("loss_scaling.clip_grad_norm")
def _() -> Observation:
    rng = np.random.default_rng(5)
    c, worst, raw, n = claim("loss_scaling.clip_grad_norm"), 0.0, 0.0, 0
    for max_norm in (0.1, 1.0, 10.0, 1e3):
        grads = [rng.standard_normal(s).astype(np.float32) for s in ((300,), (40,), (7,))]
        ref_norm, t_norm, a, b = clip_pair(grads, max_norm)
        pairs = [(ref_norm, t_norm, norm_scale(grads))]
        pairs += list(zip(a, b, clipped_scale(grads, max_norm), strict=True))
        for x, y, s in pairs:
            worst = max(worst, measure(c, x, y, scale=s))
            raw, n = max(raw, max_abs_difference(x, y)), n + np.size(x)
    return Observation(worst, n, "3 tensors (300, 40, 7 elements), max_norm 0.1 to 1000",
                       raw=raw)


@check("loss_scaling.underflow_mask")
def _() -> Observation:
    c, worst, n = claim("loss_scaling.underflow_mask"), 0.0, 0
    for _name, a, b in underflow_grads(1.0):
        worst, n = max(worst, measure(c, a == 0, b == 0)), n + a.size
    return Observation(worst, n, "fp16 without scaling, small-init output layer")


@check("loss_scaling.train")
def _() -> Observation:
    c, worst, raw, n, notes = claim("loss_scaling.train"), 0.0, 0.0, 0, []
    for precision in ("fp16", "bf16"):
        steps = synced_steps(precision, steps=10, max_grad_norm=lsc.TRAIN_MAX_GRAD_NORM)
        for s in steps:
            r, t = s["ref"], s["torch"]
            if (r.scale, r.skipped, r.grad_norm > lsc.TRAIN_MAX_GRAD_NORM) != (
                    t.scale, t.skipped, t.grad_norm > lsc.TRAIN_MAX_GRAD_NORM):
                worst = float("inf")
            for (_, a, b), bound in zip(s["params"], s["bounds"], strict=True):
                worst = max(worst, measure(c, a, b, scale=bound / EPS32))
                raw, n = max(raw, max_abs_difference(a, b)), n + a.size
        clipped = sum(s["ref"].grad_norm > lsc.TRAIN_MAX_GRAD_NORM for s in steps)
        notes.append(f"{precision}: {clipped}/10 steps clipped, loss "
                     f"-{loss_reduction([s['ref'] for s in steps]):.0%}")
    return Observation(worst, n, "10 synced steps; " + "; ".join(notes), raw=raw)


@check("loss_scaling.gpt_trajectory")
def _() -> Observation:
    from parity.drivers.loss_scaling_gpt import gpt_trajectory

    t = gpt_trajectory()
    differ = int((t.ref_scales != t.torch_scales).sum() + (t.ref_skipped != t.torch_skipped).sum())
    grew = int((np.diff(np.log2(t.torch_scales)) > 0).sum())
    return Observation(float(differ), 2 * t.ref_scales.size,
                       f"{int(t.torch_skipped.sum())} of {t.torch_skipped.size} steps skipped, "
                       f"scale grew {grew} times, final {t.torch_scales[-1]:g}")
