"""The loss_scaling claims (the kinds and the registry: parity/tolerances.py)."""

from __future__ import annotations

from parity.claims import Claim

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="loss_scaling.update_rule",
        statement=(
            "For any scale (float32, subnormals and near-max included), tracker, found_inf and "
            "hyperparameters (non-power-of-two factors, any growth_interval), one update of "
            "reference.loss_scaling.GradScaler gives the same scale bits and tracker as "
            "torch._amp_update_scale_."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The rule is integer logic plus one float64 product rounded to float32 (NOTE [ Scale "
            "update rounding ]); NumPy's float64 multiply and float32 cast are IEEE, as C++'s."
        ),
    ),
    Claim(
        id="loss_scaling.unscale",
        statement=(
            "Unscaling float32, float64 and float16 gradients (finite across magnitudes, +-inf, "
            "NaN) by any float32 scale gives the same bits and the same found_inf as "
            "torch._amp_foreach_non_finite_check_and_unscale_."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "inv = f32(1/f64(S)) then one multiply per element in the gradient's opmath type "
            "(NOTE [ Unscale by reciprocal ]): each step is one IEEE rounding. NaN payloads are "
            "not compared."
        ),
    ),
    Claim(
        id="loss_scaling.scaler",
        statement=(
            "Driven by the same gradient stream (finite across magnitudes, +inf, -inf, NaN in any "
            "tensor; unscale_ explicit or inside step; state_dict save/load across the two "
            "implementations; random hyperparameters), the reference and torch GradScalers hold "
            "the same scale, growth tracker, skip decisions, unscaled gradients and SGD "
            "parameters after every step."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Composition of loss_scaling.update_rule, loss_scaling.unscale and optim.sgd "
            "(bit-exact SGD); the skip decision is the same found_inf flag. NaN payloads are not "
            "compared."
        ),
    ),
    Claim(
        id="loss_scaling.underflow_mask",
        statement=(
            "float16 autocast without loss scaling: the set of parameter-gradient elements that "
            "are exactly zero (underflow) is the same in the reference and torch, layer by layer."
        ),
        kind="bits",
        bound=0,
        reason=(
            "An element is zero when its lp result rounds below 2^-25. The implementations agree "
            "within 1 lp ulp per op (amp.linear_fp16), so a mask can differ only where one side "
            "holds the smallest subnormal 2^-24 and the other 0; the test records how many "
            "elements sit at +-2^-24 (the edge is reached) and requires equal masks."
        ),
    ),
    Claim(
        id="loss_scaling.train",
        statement=(
            "A 60-step SGD run (lr 0.1) of the compact model (fp16 with a GradScaler, bf16 and "
            "fp32 without; grad clipping at 1.0) in both implementations: the loss falls by more "
            "than 75% in each (observed 81-82%), every step's scale and skip decision are equal, "
            "and parameters agree within atol = 0.2 (rtol 0)."
        ),
        kind="close",
        bound=(0.0, 0.2),
        reason=(
            "With clipping, |g|_inf <= 1; the two gradients differ by at most ~4 lp ulps of that "
            "(amp.model: 4 * 2^-7 for bf16, the larger), so one SGD step (lr 0.1) moves the two "
            "parameter vectors apart by <= 0.1 * 0.031 = 0.0031, and 60 steps by <= 0.19 if the "
            "differences add up without cancellation or amplification (a contracting, "
            "well-conditioned regression). Skips and scales are equal when no gradient lies "
            "within that bound of float16 overflow (checked by the equality itself)."
        ),
    ),
)
