"""The amp claims (the kinds and the registry: parity/tolerances.py)."""

from __future__ import annotations

from parity.claims import Claim

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="amp.casts",
        statement=(
            "Under autocast (float16 and bfloat16, CPU), what a Linear saves for backward (the lp "
            "cast of its input, addmm's mat1, and of its weight, mat2) is bit-identical in "
            "reference.amp and torch.autocast, and the float32 master weights are unchanged."
        ),
        kind="bits",
        bound=0,
        reason=(
            "A cast is one correctly rounded operation (round to nearest even) with one right "
            "answer (formats.encode_f32); the weight is cast, never rounded in place."
        ),
    ),
    Claim(
        id="amp.linear_bf16",
        statement=(
            "A Linear under bfloat16 autocast, fed the same input, weights and lp output "
            "gradient: output, input gradient, weight gradient and bias gradient are within 1 "
            "bfloat16 ulp of torch's, at every element where the float32 accumulation bound is "
            "below half a bfloat16 ulp of the result (the test counts the others; none at its "
            "shapes)."
        ),
        kind="ulps",
        bound=1,
        reason=(
            "Both compute q(sum_i a_i b_i) from the same lp operands: a float32 accumulation "
            "rounded once to lp. The accumulations differ only in order, by at most gamma_k "
            "sum|a_i b_i| (gamma_k = k 2^-24, k terms); when that is below half an lp ulp u of "
            "the result, |acc_ref - acc_torch| < u/2 and two round-to-nearest results of values "
            "closer than u are at most 1 ulp apart."
        ),
        fmt="bfloat16",
    ),
    Claim(
        id="amp.linear_fp16",
        statement=(
            "As amp.linear_bf16, under float16 autocast: within 1 float16 ulp where the float32 "
            "accumulation bound is below half a float16 ulp."
        ),
        kind="ulps",
        bound=1,
        reason=(
            "The derivation of amp.linear_bf16 with the float16 ulp (2^-10 relative, 2^-24 "
            "absolute in the subnormal range)."
        ),
        fmt="float16",
    ),
    Claim(
        id="amp.activation_bf16",
        statement=(
            "GELU (erf and tanh), Tanh and ReLU on a bfloat16 tensor under autocast: forward "
            "output and input gradient within 1 bfloat16 ulp of torch's wherever the float32 "
            "bound of the nn claims (8 eps |x| forward, 8 eps |g| (1 + |x| (1 + x^2)) backward) "
            "is below half a bfloat16 ulp of the result (the check counts the others: GELU's "
            "negative tail, where |y| << |x| and float32 cancellation dominates)."
        ),
        kind="ulps",
        bound=1,
        reason=(
            "Both compute in float32 and round once to lp. The float32 results differ by at most "
            "the nn.tanh/nn.gelu*/nn.relu bounds (<= 8 eps S); where that is below half an lp ulp "
            "u of the result, the two values are closer than u and their round-to-nearest images "
            "are at most 1 ulp apart."
        ),
        fmt="bfloat16",
    ),
    Claim(
        id="amp.activation_fp16",
        statement=(
            "As amp.activation_bf16 on float16 tensors: within 1 float16 ulp under the same "
            "precondition."
        ),
        kind="ulps",
        bound=1,
        reason="As amp.activation_bf16, with the float16 ulp.",
        fmt="float16",
    ),
    Claim(
        id="amp.model",
        statement=(
            "The compact model's forward output and parameter gradients under autocast (bf16 and "
            "fp16; depth 3, width 64) agree with torch's after dividing both by max|torch's| of "
            "each tensor, within atol = 16 * 2^-11 (0.0078)."
        ),
        kind="close",
        bound=(0.0, 16 * 2.0**-11),
        reason=(
            "Each op adds at most 1 lp ulp (amp.linear_*, amp.activation_*), i.e. a relative 2^-8 "
            "(bf16) or 2^-11 (fp16) of the tensor's scale; the forward has 2L - 1 = 5 lp ops and "
            "a gradient passes through at most 2L = 6 more, each propagating the earlier "
            "differences with gain <= 1 for these unit-scale layers; 16 ulps of fp16 leaves room "
            "for that. bf16 is held to the same number (observed: 0)."
        ),
    ),
)
