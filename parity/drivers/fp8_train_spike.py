"""The loss-scaling lesson carried to fp8: an activation spike against delayed scaling.

A loss scale chosen from the past overflows when a gradient outgrows it; a delayed fp8 scale
chosen from the amax history saturates when an activation does. One layer in each tree runs
SPIKE_STEPS forward/backward steps (no update) on x ~ N(0, 1), except at SPIKE_STEP, where x
is multiplied by 2^SPIKE_EXP (a seeded spike: one bad batch, an outlier feature). At every
step the input's scaled values x * s, the values the e4m3 cast receives before its clamp,
are counted in float8_e4m3fn format terms by the numerics detector's format view
(reference.numerics.count_rows): over_max (the clamp saturates them at 448) and to_zero
(they underflow to 0).

    recipe        s at the spike step               over_max at the spike
    delayed       448 / (history's amax ~ 4)        most of the tensor: the stale scale saturates
    current       448 / (this step's amax)          0
    delayed + m   448 / amax / 2^m, m = SPIKE_EXP   0 (the headroom the margin buys)
    history 1     448 / (last step's amax)          as delayed: any history is the past

The margin's price: with the spike in the history (16 steps) the scale is 2^(2 SPIKE_EXP) too
small and ordinary inputs underflow (to_zero); without a margin a history of 1 has no
headroom at all, and ordinary steps saturate a few values now and then. The repair that
holds is current scaling. The count rows of both trees are compared bit for bit
(claim fp8_train.spike).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from common.format_spec import FORMATS
from common.fp8_train import RECIPES, Recipe
from parity.drivers.fp8_train import layer_pair
from reference import fp8_scaling as rscale
from reference.numerics import count_rows
from torch_impl import fp8_scaling as tscale

SPIKE_STEPS, SPIKE_STEP, SPIKE_EXP = 24, 8, 6
N, D_IN, D_OUT = 64, 32, 32
OVER_MAX, TO_ZERO = 4, 5  # COLUMNS' over_max and to_zero (common/numerics_report.py)
# the runs of the lesson: name -> recipe (fp8-delayed and its two repairs, and current scaling)
RUNS: dict[str, Recipe] = {
    "delayed": RECIPES["fp8-delayed"],
    "current": RECIPES["fp8-tensorwise"],
    "delayed_margin": replace(RECIPES["fp8-delayed"], margin=SPIKE_EXP),
    "delayed_history_1": replace(RECIPES["fp8-delayed"], history=1),
}


def inputs(seed: int = 0) -> list[np.ndarray]:
    """The steps' float32 inputs (N, D_IN), the spike at SPIKE_STEP."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((N, D_IN)).astype(np.float32) for _ in range(SPIKE_STEPS)]
    xs[SPIKE_STEP] = xs[SPIKE_STEP] * np.float32(2.0**SPIKE_EXP)
    return xs


def run(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """{"reference", "torch"}: (SPIKE_STEPS, COLUMNS) e4m3 format counts of x * s per step,
    and "error": the reference's max |y - x W^T| / max |x W^T| per step (float64 product)."""
    r = RUNS[name]
    ref, tor = layer_pair("fp8-delayed", D_IN, D_OUT, seed)
    ref.recipe = tor.recipe = r
    if r.history != RECIPES["fp8-delayed"].history:  # a shorter history: new buffers
        for t in ("input", "weight", "grad_output"):
            ref._buffers[f"fp8_amax_history_{t}"] = np.zeros(r.history, dtype=np.float32)
            setattr(tor, f"fp8_amax_history_{t}", torch.zeros(r.history))
    fmt = FORMATS[r.forward]
    g = np.full((N, D_OUT), 1e-3, dtype=np.float32)
    counts: dict[str, list] = {"reference": [], "torch": []}
    error = []
    for x in inputs(seed):
        if r.delayed:  # the scale the step's cast uses: the stored one
            s_ref = ref.buffers_of()["fp8_scale_input"].copy()
            s_tor = tor.fp8_scale_input.clone()
        else:
            s_ref = rscale.amax_to_scale(rscale.tensor_amax(x), r.forward)
            s_tor = tscale.amax_to_scale(tscale.tensor_amax(torch.from_numpy(x)), r.forward)
        counts["reference"].append(count_rows([x * s_ref], fmt)[0])
        counts["torch"].append(count_rows([(torch.from_numpy(x) * s_tor).numpy()], fmt)[0])
        y = ref.forward(x)
        ref.backward(g)
        ref.weight.grad = ref.bias.grad = None
        tor(torch.from_numpy(x)).backward(torch.from_numpy(g))
        exact = x.astype(np.float64) @ ref.weight.data.T.astype(np.float64) + ref.bias.data
        error.append(np.abs(y - exact).max() / np.abs(exact).max())
    return {"reference": np.array(counts["reference"]), "torch": np.array(counts["torch"]),
            "error": np.array(error)}
