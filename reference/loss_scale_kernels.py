"""The two kernels behind a GradScaler: the scale update, and the non-finite check with unscale.

torch runs both in C++ (`torch._amp_update_scale_`, `torch._amp_foreach_non_finite_check_and_
unscale_`; aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp, the CUDA twins in
AmpKernels.cu and ForeachNonFiniteCheckAndUnscale.cu compute the same formulas). Here they are
NumPy functions on 0-d arrays, mutated in place as torch's are; reference/loss_scaling.py
holds the bookkeeping around them.

The update rule, as scalar code (executable: tests/test_loss_scaling_reference.py compiles
this text and holds `update_scale_` to it, bit for bit). `f32(v)` rounds a float to
float32; a product of a float32 and a Python float is formed in float64, as in C++.

    def update_rule(scale, growth_tracker, hysteresis_tracker, found_inf,
                    growth_factor, backoff_factor, growth_interval, hysteresis, min_scale):
        if found_inf:
            hysteresis_tracker = hysteresis_tracker - 1
            if hysteresis_tracker > 0:
                return scale, 0, hysteresis_tracker
            scale = f32(scale * backoff_factor)
            if min_scale is not None:
                scale = max(scale, f32(min_scale))
            return scale, 0, hysteresis_tracker
        successful = growth_tracker + 1
        if successful == growth_interval:
            grown = f32(scale * growth_factor)
            if math.isfinite(grown):
                scale = grown
            return scale, 0, hysteresis
        return scale, successful, hysteresis

With hysteresis=1 and min_scale=None this is torch's `_amp_update_scale_`. Hysteresis follows
NVIDIA Apex's `update_scale_hysteresis` (Megatron-LM, DeepSpeed): tolerate hysteresis - 1
overflows in a row before backing off; the counter refills on every finite step.
`min_scale` is Megatron-LM's floor: torch's scale can halve down to 0.0 (0 * growth = 0: it
never recovers).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["inv_scale", "non_finite_check_and_unscale_", "update_scale_"]

# NOTE [ Unscale by reciprocal ]
# torch unscales by multiplying with a reciprocal, not by dividing:
#     inv_scale = scale.double().reciprocal().float()        # grad_scaler.py, unscale_
#     g = (inv_scale == 1) ? g : g * inv_scale                 # in g's opmath type
# so inv = f32(1 / f64(S)): the reciprocal correctly rounded to float64, then rounded to
# float32 ("FP32 division can be imprecise for certain compile options"). This double
# rounding is harmless: float64 carries 53 >= 2 * 24 + 2 bits, enough for a quotient of
# float32 values rounded twice to equal the float32 quotient rounded once, so inv is the
# correctly rounded float32 reciprocal (tests/test_loss_scaling_reference.py checks every
# float32 significand). The reference keeps torch's formula, which says what torch does
# without relying on that fact. A float32 gradient is then multiplied in
# float32, a float64 gradient in float64 by that float32 value, a float16/bfloat16 one in
# float32 and rounded back. For S a power of two, g * inv == g / S exactly; for any other
# S the two differ in some elements (docs/loss_scaling.md measures how many). The
# non-finite check looks at g BEFORE the multiply: with S < 1 (inv > 1) a finite g * inv
# can overflow to inf unflagged, and S = 0.0 gives inv = inf.

# NOTE [ Scale update rounding ]
# The kernels hold the scale as a float32 and the factors as C++ doubles:
#     *scale = (*scale) * backoff_factor;                      // float * double -> double
#     new_scale = static_cast<float>((*scale) * growth_factor);
# The product is formed in float64 (rounded once there) and rounded again to float32.
# float32 x float64 needs up to 77 bits, so the float64 product is itself rounded: this is
# double rounding, and a float32 product (f32(S) * f32(factor)) differs from it for
# non-power-of-two factors. Growth is capped: a grown scale that is not finite is
# dropped (the scale stays, the tracker still resets). Backoff has no floor: S reaches
# 0.0 after about 277 halvings from 2^128 (subnormals on the way).

# NOTE [ Tracker order ]
# found_inf: the growth tracker resets to 0, the scale backs off.
# finite: successful = tracker + 1 is compared with growth_interval BEFORE being stored;
# on equality the scale grows and the tracker is 0, otherwise the tracker is `successful`.
# So with growth_interval = n the scale grows on every n-th consecutive finite step, and a
# growth_interval <= 0 never grows. The tracker is an int32, as torch's.


def update_scale_(scale: np.ndarray, growth_tracker: np.ndarray, found_inf: np.ndarray,
                  growth_factor: float, backoff_factor: float, growth_interval: int, *,
                  hysteresis_tracker: int = 1, hysteresis: int = 1,
                  min_scale: float | None = None) -> int:
    """One update of the 0-d float32 `scale` and int32 `growth_tracker`, in place (the
    module docstring's update_rule; torch._amp_update_scale_ with the default extras).

    Returns the new hysteresis tracker (the caller keeps it: torch has none).
    """
    if found_inf:
        hysteresis_tracker -= 1
        growth_tracker[...] = 0
        if hysteresis_tracker > 0:
            return hysteresis_tracker
        scale[...] = scale.astype(np.float64) * np.float64(backoff_factor)
        if min_scale is not None:
            scale[...] = np.maximum(scale, np.float32(min_scale))
        return hysteresis_tracker
    successful = growth_tracker + np.int32(1)
    if successful == growth_interval:
        # an infinite growth is computed, then dropped; so is a NaN one, 0 * inf (a scale
        # backed off to 0 grown by an infinite factor: torch's isfinite drops it alike)
        with np.errstate(over="ignore", invalid="ignore"):
            grown = (scale.astype(np.float64) * np.float64(growth_factor)).astype(np.float32)
        if np.isfinite(grown):
            scale[...] = grown
        growth_tracker[...] = 0
    else:
        growth_tracker[...] = successful
    return hysteresis


def inv_scale(scale: np.ndarray) -> np.ndarray:
    """f32(1 / f64(S)) as a 0-d float32 array (NOTE [ Unscale by reciprocal ])."""
    with np.errstate(divide="ignore", over="ignore"):  # S = 0 or subnormal: inv = inf
        return np.asarray(1.0 / np.asarray(scale).astype(np.float64)).astype(np.float32)


def non_finite_check_and_unscale_(grads: Sequence[np.ndarray], found_inf: np.ndarray,
                                  inv: np.ndarray) -> None:
    """torch._amp_foreach_non_finite_check_and_unscale_: found_inf <- 1.0 if any element
    of any gradient is inf or NaN; then every g <- g * inv in place, in g's opmath type
    (float16 through float32), skipped when inv == 1 (NOTE [ Unscale by reciprocal ]).

    inf and NaN gradients are expected here (that is what the check is for), so the
    floating-point warnings of the multiply are silenced.
    """
    for g in grads:
        if g.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError(f"non_finite_check_and_unscale_: expected float16/32/64 "
                            f"gradients, got {g.dtype}")
        if not np.all(np.isfinite(g)):
            found_inf[...] = 1.0
        if inv == np.float32(1.0):
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            if g.dtype == np.float16:
                np.copyto(g, (g.astype(np.float32) * inv).astype(np.float16))
            else:
                np.multiply(g, inv.astype(g.dtype), out=g)
