"""The claim table: every parity assertion in this project names one of these claims.

A claim is `Claim(id, topic, statement, kind, bound, reason)`:

kind         bound means                                   compared by (parity/compare.py)
-----------  --------------------------------------------  -------------------------------------
bits         mismatching bit patterns allowed (always 0)    integer views of the two arrays
nan_class    mismatches allowed (always 0); NaN == NaN      integer views, NaNs as one class
ulps         k: |a - b| <= k units in the last place of     exact integer distance on the
             the format named in `fmt`                      format's ordered encoding
close        (rtol, atol): |a - b| <= atol + rtol * |b|     float64 arithmetic
statistical  false-failure probability of the test          the test's own statistic; the
                                                            observation is its p-value, and
                                                            the claim fails below the bound

Tolerances are declared here once, each with the derivation in `reason`; a test or a report
check looks its claim up by id and never writes a bare number. `docs/tolerances.md` is
generated from this table (`python -m parity tolerances --write`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["bits", "nan_class", "ulps", "close", "statistical"]
KINDS: tuple[str, ...] = ("bits", "nan_class", "ulps", "close", "statistical")


@dataclass(frozen=True)
class Claim:
    """One checked statement: what must hold, how tightly, and why that tightness."""

    id: str
    topic: str
    statement: str
    kind: Kind
    bound: float | tuple[float, float]
    reason: str
    fmt: str | None = None  # the format whose ulp an `ulps` bound counts in

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.id}: kind {self.kind!r} is not one of {KINDS}")
        if not self.reason.strip():
            raise ValueError(f"claim {self.id}: a claim without a reason is a bug")
        if self.kind in ("bits", "nan_class") and self.bound != 0:
            raise ValueError(f"claim {self.id}: {self.kind} claims allow 0 mismatches")
        if self.kind == "ulps" and self.fmt is None:
            raise ValueError(f"claim {self.id}: an ulps claim must name its format")
        if self.kind == "close" and not (isinstance(self.bound, tuple) and len(self.bound) == 2):
            raise ValueError(f"claim {self.id}: a close claim's bound is (rtol, atol)")
        if self.kind == "statistical" and not 0 < float(self.bound) < 1:  # type: ignore[arg-type]
            raise ValueError(f"claim {self.id}: a statistical bound is a probability in (0, 1)")

    @property
    def tolerance(self) -> str:
        """The bound in words, as the report and docs/tolerances.md print it."""
        if self.kind == "bits":
            return "bit-identical"
        if self.kind == "nan_class":
            return "bit-identical, NaN as a class"
        if self.kind == "ulps":
            return f"<= {self.bound:g} ulp of {self.fmt}"
        if self.kind == "close":
            rtol, atol = self.bound  # type: ignore[misc]
            return f"rtol={rtol:.3g}, atol={atol:.3g}"
        return f"P(false failure) <= {self.bound:.1e}"


# One tuple per topic, concatenated below; a topic edits only its own tuple.
FORMATS_CLAIMS: tuple[Claim, ...] = (
    Claim(
        "formats.ranges",
        "formats",
        "Every range property of every named format (bits, eps, max, tiny, smallest subnormal, "
        "max/min exponent) is equal in reference.formats, torch.finfo and ml_dtypes.finfo.",
        "bits",
        0,
        "The properties are exact dyadic numbers derived from (exponent bits, mantissa bits, "
        "convention); any difference would be an error, not rounding.",
    ),
    Claim(
        "formats.decode",
        "formats",
        "Every bit pattern of every 8- and 16-bit format decodes to the same value in the "
        "reference, in torch (.view then .to(float32)) and in ml_dtypes.",
        "nan_class",
        0,
        "Decoding is exact (every format value is a float32); NaN payloads are not "
        "preserved alike by the three libraries, so NaNs compare as a class.",
    ),
    Claim(
        "formats.encode_f32",
        "formats",
        "Encoding float32 inputs with round-to-nearest-even is bit-identical to torch's native "
        "cast (with torch's overflow policy) and to ml_dtypes (with overflow='nan' for "
        "float8_e4m3fn); every NaN input gives a NaN.",
        "nan_class",
        0,
        "One correctly rounded operation has one right answer; NaN sign and payload differ "
        "between libraries and even between torch code paths (a bf16 NaN is 0xFFFF from "
        "Tensor.to on a 1-d CPU tensor, 0x7FC0 from a 0-d one), so NaNs compare as a class.",
    ),
    Claim(
        "formats.encode_f64_correct",
        "formats",
        "Encoding float64 inputs (via=None) is correctly rounded: equal to rounding the exact "
        "rational value with fractions.Fraction, and equal to the torch twin's round-to-odd "
        "construction.",
        "nan_class",
        0,
        "Correct rounding is unique. The torch twin gets it from native casts by rounding to "
        "odd in float32 first (float32 keeps >= 2 more bits than every target; Boldo and "
        "Melquiond 2008), an independent construction.",
    ),
    Claim(
        "formats.encode_f64_via_f32",
        "formats",
        "Encoding float64 inputs with via='float32' is bit-identical to torch's native "
        "float64 -> low-precision cast, which rounds through float32 (double rounding).",
        "nan_class",
        0,
        "Both round twice at the same two precisions; each rounding is exact RNE.",
    ),
    Claim(
        "formats.toward_zero",
        "formats",
        "Rounding toward zero is bit-identical between the reference (truncation of the "
        "integer significand) and the torch twin (native cast, then one step toward zero "
        "where the cast rounded away).",
        "nan_class",
        0,
        "Truncation has one right answer; NaNs compare as a class.",
    ),
    Claim(
        "formats.stochastic_bits",
        "formats",
        "Given the same 32-bit random words, stochastic rounding of float32 inputs is "
        "bit-identical in the reference and the torch twin.",
        "nan_class",
        0,
        "Both round up exactly when the random word is below the top 32 dropped bits; "
        "integer comparisons have no rounding.",
    ),
    Claim(
        "formats.stochastic_unbiased",
        "formats",
        "Stochastic rounding is unbiased: the mean of n roundings of x lies within "
        "z * sigma / sqrt(n) of x, sigma = sqrt(p(1-p)) * spacing, z = 5.0.",
        "statistical",
        5.8e-7,
        "Each rounding is lo + spacing * Bernoulli(p); by the CLT the standardized mean is "
        "~N(0,1) for n = 20000, and P(|Z| > 5) = 5.7e-7 (two-sided) per checked input.",
    ),
    Claim(
        "formats.sweep",
        "formats",
        "Over all 2^32 float32 inputs (slow) or a sample, the reference, torch and ml_dtypes "
        "encodings agree except where the declared overflow/NaN policies differ.",
        "nan_class",
        0,
        "Exhaustive form of formats.encode_f32.",
    ),
)

# nn: `close` bounds below are (rtol=0, atol=c) applied to |a - b| / (eps * S): the
# difference in units of the dtype's eps times a per-claim scale S stated in the claim
# (parity.checks.nn.in_eps_units). eps = 2^-23 (float32) or 2^-52 (float64); u = eps/2.
NN_CLAIMS: tuple[Claim, ...] = (
    Claim(
        "nn.relu",
        "nn",
        "ReLU forward and input gradient are bit-identical to torch (float32, float64).",
        "bits",
        0,
        "max(x, 0) and where(y > 0, g, 0) are exact: no rounding anywhere.",
    ),
    Claim(
        "nn.tanh.forward",
        "nn",
        "Tanh forward: |y_ref - y_torch| <= 2 eps |y_torch| (S = |y|).",
        "close",
        (0.0, 2.0),
        "NumPy's tanh and torch's SLEEF tanh (u10) are each within 1 ulp of tanh(x), and "
        "1 ulp(y) <= eps |y|, so they differ by <= 2 eps |y|. Measured 1.0 (f32 and f64).",
    ),
    Claim(
        "nn.tanh.backward",
        "nn",
        "Tanh input gradient g (1 - y^2): |dx_ref - dx_torch| <= 6 eps |g| (S = |g|).",
        "close",
        (0.0, 6.0),
        "y differs by <= 2 eps|y| (nn.tanh.forward), so y^2 by <= 4 eps y^2 + 2u y^2; "
        "1 - y^2 and the product by g each round once per side (2u|1-y^2| + 2u|dx|); with "
        "|y| <= 1 the total is <= (4 + 1 + 1 + 0.5) eps |g| < 6 eps |g|. Measured 1.4.",
    ),
    Claim(
        "nn.gelu_tanh.forward",
        "nn",
        "GELU(approximate='tanh') forward: |y_ref - y_torch| <= 3 eps |x| (S = |x|).",
        "close",
        (0.0, 3.0),
        "Both evaluate NOTE [ GELU formulas ] with the same dtype constants and operation "
        "order, so tanh's argument is bit-identical; t = tanh(.) differs by <= 2 eps, "
        "1 + t rounds (u per side), y = 0.5 x (1 + t) rounds (u|y| <= u|x| per side): "
        "|dy| <= 0.5|x|(2 eps + eps) + eps|x| = 2.5 eps |x|. Measured 1.0.",
    ),
    Claim(
        "nn.gelu_tanh.backward",
        "nn",
        "GELU(approximate='tanh') input gradient: |dx_ref - dx_torch| <= 8 eps S with "
        "S = |g| (1 + |x| (1 + x^2)).",
        "close",
        (0.0, 8.0),
        "Same formula and order both sides (NOTE [ GELU formulas ]); only t differs "
        "(<= 2 eps). 0.5 (1 + t) carries <= 1.5 eps; (1 - t^2) carries <= 5 eps absolute "
        "and is multiplied by 0.5 |x| beta (1 + 3 kappa x^2) <= 0.4 |x| (1 + x^2); the 6 "
        "remaining roundings add <= 6 u of the largest term. Sum < 8 eps S. Measured 0.9.",
    ),
    Claim(
        "nn.gelu.forward",
        "nn",
        "Exact (erf) GELU forward: |y_ref - y_torch| <= 5 eps |x| (S = |x|).",
        "close",
        (0.0, 5.0),
        "float64: erf (math.erf vs SLEEF u10) differs by <= 2 ulp, as for tanh GELU -> "
        "2.5 eps|x|. float32: torch's GELU kernel uses ATen's vectorized float erf (a "
        "polynomial with exp, not SLEEF); measured on a dense grid of 2e6 points on "
        "[-12, 12] against float64 erf, torch is within 3.13 eps|x| of exact GELU and the "
        "reference (float64 erf rounded once) within 0.9 eps|x|: 4.03 -> bound 5.",
    ),
    Claim(
        "nn.gelu.backward",
        "nn",
        "Exact (erf) GELU input gradient: |dx_ref - dx_torch| <= 4 eps S with "
        "S = |g| (1 + |x| (1 + x^2)).",
        "close",
        (0.0, 4.0),
        "cdf + x pdf with pdf = alpha exp(-x^2/2): erf and exp differ by <= 2 ulp (float64), "
        "exp's argument carries eps x^2/2 relative -> x pdf error <= eps |x|^3 pdf; float32 "
        "adds torch's vectorized erf: measured on 4e5 grid points in [-12, 12] torch is "
        "within 1.9 eps S of the exact derivative, the reference within 0.5: 2.4 -> bound 4.",
    ),
    Claim(
        "nn.dropout",
        "nn",
        "Given the same keep-mask, Dropout's output and input gradient are bit-identical to "
        "torch's nn.Dropout (training), and both are the identity in eval and for p = 0.",
        "bits",
        0,
        "NOTE [ Dropout mask ]: both compute x * (keep / (1 - p)) in the input dtype with "
        "the same two roundings (the division, the product); the gradient is g * mask.",
    ),
    Claim(
        "nn.linear",
        "nn",
        "Linear forward, input, weight and bias gradients: |a - b| <= eps (k + 1) S with "
        "S = |A| |B| (+ |b|) the product of absolute values and k its inner length "
        "(in_features, out_features, batch N, batch N).",
        "close",
        (0.0, 1.0),
        "A dot product of length k in any summation order (and with or without FMA) is "
        "within gamma_k sum|a_i b_i| ~ k u S of the exact value (Higham, Thm 3.5); NumPy's "
        "OpenBLAS and torch's MKL/addmm use different orders, so they differ by <= "
        "2 (k + 1) u S = (k + 1) eps S (k + 1: the bias add). Measured <= 0.42.",
    ),
    Claim(
        "nn.mse_loss.elementwise",
        "nn",
        "MSELoss with reduction='none', and its input gradient for every reduction, are "
        "bit-identical to torch.",
        "bits",
        0,
        "(x - t)^2 and (x - t) * norm * g are the same IEEE operations in the same order "
        "(torch's mse_loss_backward: sub, mul_(2/n rounded to dtype), mul_(grad)).",
    ),
    Claim(
        "nn.mse_loss.reduced",
        "nn",
        "MSELoss 'sum' and 'mean': |l_ref - l_torch| <= eps (n + 1) S, S = sum (x - t)^2 "
        "(divided by n for 'mean').",
        "close",
        (0.0, 1.0),
        "The n squared terms are bit-identical (nn.mse_loss.elementwise); only the summation "
        "order differs (NumPy pairwise, torch cascaded): each side within gamma_n S of the "
        "exact sum, plus one rounding of the division by n. Measured <= 0.005.",
    ),
    Claim(
        "nn.cross_entropy",
        "nn",
        "CrossEntropyLoss loss and input gradient: |a - b| <= eps S with "
        "S = (C + N + 2)(1 + 2 max|x|) times N for reduction 'sum' (loss) and times "
        "|g| (/ N for 'mean') for the gradient.",
        "close",
        (0.0, 1.0),
        "x - max x is bit-identical; exp differs by <= 2 ulp, a C-term sum of positives by "
        "<= C eps relative, log by <= eps |log| + the propagated relative error: a "
        "log-probability is within (C + 2) eps (1 + 2 max|x|) on each side. Reducing N "
        "of them adds N eps of their sum. The gradient softmax - onehot is bounded by "
        "the same relative errors times |g|. Measured <= 0.39.",
    ),
    Claim(
        "nn.saved_tensors",
        "nn",
        "For every layer the reference's tape holds tensors of the same shapes, dtypes and "
        "bytes as what torch's saved_tensors_hooks see (parameters excluded on both sides).",
        "bits",
        0,
        "Shapes, dtypes and byte counts are integers: any difference is a design mismatch.",
    ),
    Claim(
        "nn.state_dict_roundtrip",
        "nn",
        "reference state_dict -> torch -> reference (and torch -> reference -> torch) keeps "
        "every key, shape, dtype and bit; the converted model gives torch's outputs.",
        "bits",
        0,
        "The conversion is a copy: no arithmetic.",
    ),
    Claim(
        "nn.mlp.forward",
        "nn",
        "make_mlp output with the same weights (and dropout masks) is within the bound "
        "propagated layer by layer: e_out = |W| e_in + eps (k + 1)(|W||x| + |b|) for Linear, "
        "e_out = L e_in + (the layer's claim) for activations (L = 1, 1, 1.13 for ReLU, "
        "Tanh, GELU).",
        "close",
        (0.0, 1.0),
        "First-order forward error analysis: each layer adds its own claimed bound and "
        "passes the incoming difference on amplified by at most |W| (Linear) or its "
        "Lipschitz constant (max GELU' = 1.1290 < 1.13). Measured <= 0.1.",
    ),
)

OPTIM_CLAIMS: tuple[Claim, ...] = (
    Claim(
        "optim.fma_bits",
        "optim",
        "reference.optim.fma and lerp equal torch's CPU add(alpha=), addcmul_ and lerp_ "
        "(scalar weight) in float32 and float64 at every size (vector body and scalar tail, "
        "0-d included), with fused = (torch's CPU capability is not DEFAULT).",
        "bits",
        0,
        "On AVX2/AVX512 builds every element is one hardware FMA (vec::fmadd in the body, "
        "GCC-contracted C++ in the tail); under ATEN_CPU_CAPABILITY=default none is. The "
        "reference computes the correctly rounded FMA exactly (float64 round-to-odd for "
        "float32, TwoProduct + TwoSum + round-to-odd for float64), a unique result.",
    ),
    Claim(
        "optim.sgd_bits",
        "optim",
        "SGD (momentum, dampening, nesterov, weight_decay, maximize) leaves parameters and "
        "momentum buffers bit-identical to torch.optim.SGD on CPU, float32 and float64, for "
        "any number of steps, with lr changed mid-run and state_dict save/load mid-run.",
        "bits",
        0,
        "Each step is fma(g, -lr, p), fma(p, wd, g), fma(g, 1 - dampening, b * m): scalars "
        "cast to the dtype, each op rounded once exactly as torch's kernels round (optim."
        "fma_bits); no reduction, so no order freedom.",
    ),
    Claim(
        "optim.adam_bits",
        "optim",
        "Adam and AdamW (amsgrad, maximize, weight decay) leave parameters and every state "
        "entry bit-identical to torch.optim on CPU, float32 and float64, over steps, lr "
        "changes and save/load, when the reference is given torch's square root.",
        "bits",
        0,
        "Every op but sqrt is the reference's own and rounds once like torch's kernel "
        "(lerp and addcmul fused, addcdiv unfused, Python-float bias corrections). torch's "
        "sqrt is MKL VML's, not IEEE's (optim.torch_sqrt_*), so it is the one op passed in.",
    ),
    Claim(
        "optim.adam_moments_bits",
        "optim",
        "With the reference's own IEEE sqrt and weight_decay = 0, Adam's step, exp_avg, "
        "exp_avg_sq and max_exp_avg_sq stay bit-identical to torch's for any number of steps.",
        "bits",
        0,
        "The moments read only the gradients, never the parameter or the sqrt, and each "
        "moment update is bit-exact (optim.fma_bits).",
    ),
    Claim(
        "optim.torch_sqrt_f32_ulps",
        "optim",
        "torch.sqrt of float32 CPU tensors is within 1 ulp of the correctly rounded square "
        "root (np.sqrt), and differs from it in about 17% of elements on MKL builds.",
        "ulps",
        1,
        "MKL VML's vsSqrt (torch's CPU sqrt with MKL) is documented by Intel as accurate "
        "to < 1 ulp (HA mode) but not correctly rounded; 1 ulp is the measured maximum.",
        fmt="float32",
    ),
    Claim(
        "optim.torch_sqrt_f64_ulps",
        "optim",
        "torch.sqrt of float64 CPU tensors is within 1 ulp of the correctly rounded square "
        "root (np.sqrt).",
        "ulps",
        1,
        "As optim.torch_sqrt_f32_ulps (MKL VML vdSqrt, < 1 ulp), counted on float64's codes "
        "(reference.formats.ulp_distance). Measured: 1.2% of elements differ, by 1 ulp.",
        fmt="float64",
    ),
    Claim(
        "optim.schedules_bits",
        "optim",
        "StepLR, CosineAnnealingLR and LinearLR produce bit-identical lr sequences to "
        "torch.optim.lr_scheduler for many steps and after state_dict save/load mid-run.",
        "bits",
        0,
        "Both evaluate the same recursive Python-float formulas (math.cos, float64) in the "
        "same order; the closed form would NOT match (NOTE [ Chainable schedules ]).",
    ),
    Claim(
        "optim.state_roundtrip_bits",
        "optim",
        "Optimizer and scheduler state converted reference -> torch -> reference (and "
        "torch -> reference -> torch) is bit-identical, and a run resumed on the other side "
        "from converted state continues bit-identically.",
        "bits",
        0,
        "Conversion copies bytes (numpy <-> tensor of the same dtype) and Python scalars; "
        "nothing is recomputed or rounded.",
    ),
)

DATA_CLAIMS: tuple[Claim, ...] = (
    Claim(
        "data.task",
        "data",
        "make_task(seed, n, ...) gives bit-identical inputs, labels and values in the "
        "reference (NumPy) and the torch twin, computed independently, float32 and float64.",
        "bits",
        0,
        "Words are integer hashes mod 2^32 (exact on both sides: uint64 products in NumPy, "
        "split 32x16-bit int64 products in torch); inputs are k * 2^-23, exact; the teacher "
        "uses small integer weights, so every partial sum is a multiple of 2^-23 below 2^18: "
        "exact in float64 in any BLAS order (NOTE [ Exact teacher arithmetic ]); float32 is "
        "then one correctly rounded cast; argmax takes the first maximum in both.",
    ),
    Claim(
        "data.order",
        "data",
        "epoch_order(seed, epoch, n) is the same permutation in the reference and in torch, "
        "for every seed and epoch in [0, 2^32).",
        "bits",
        0,
        "The order is the argsort of hashed words (integer ops, exact on both sides); the "
        "hash is a bijection of the index, so the words are distinct and the sorted order "
        "is unique: numpy.argsort and torch.argsort cannot disagree.",
    ),
    Claim(
        "data.resume_reference",
        "data",
        "In the reference, saving ResumableSampler.state_dict() after any number of batches "
        "(mid-epoch, at an epoch boundary, with or without drop_last) and loading it into a "
        "fresh sampler yields the same remaining batches as the uninterrupted run.",
        "bits",
        0,
        "The order of an epoch is a pure function of (seed, epoch) and the state counts "
        "exactly the indices consumed; index streams are integers, compared exactly.",
    ),
    Claim(
        "data.resume_torch",
        "data",
        "In torch, a DataLoader from make_loader over a ResumableSampler restored from "
        "state_dict() after any number of batches yields the same remaining batches "
        "(inputs, labels, values, batch sizes) as the uninterrupted DataLoader.",
        "bits",
        0,
        "Single-process DataLoader pulls exactly one batch of indices per next(), so the "
        "sampler state is what was consumed; batches are copies of dataset rows, no arithmetic.",
    ),
    Claim(
        "data.loader",
        "data",
        "The batch stream of make_loader is bit-identical across implementations, and a "
        "sampler state saved by one implementation resumes the same stream in the other.",
        "bits",
        0,
        "Same dataset bits (data.task), same order (data.order), the same batching rule "
        "(reference BatchSampler mirrors torch.utils.data.BatchSampler) and one state "
        "format of plain ints; batching copies rows without arithmetic.",
    ),
)

AMP_CLAIMS: tuple[Claim, ...] = (
    Claim(
        "amp.casts",
        "amp",
        "Under autocast (float16 and bfloat16, CPU), what a Linear saves for backward (the lp "
        "cast of its input, addmm's mat1, and of its weight, mat2) is bit-identical in "
        "reference.amp and torch.autocast, and the float32 master weights are unchanged.",
        "bits",
        0,
        "A cast is one correctly rounded operation (round to nearest even) with one right "
        "answer (formats.encode_f32); the weight is cast, never rounded in place.",
    ),
    Claim(
        "amp.linear_bf16",
        "amp",
        "A Linear under bfloat16 autocast, fed the same input, weights and lp output gradient: "
        "output, input gradient, weight gradient and bias gradient are within 1 bfloat16 ulp "
        "of torch's, at every element where the float32 accumulation bound is below half a "
        "bfloat16 ulp of the result (the test counts the others; none at its shapes).",
        "ulps",
        1,
        "Both compute q(sum_i a_i b_i) from the same lp operands: a float32 accumulation "
        "rounded once to lp. The accumulations differ only in order, by at most "
        "gamma_k sum|a_i b_i| (gamma_k = k 2^-24, k terms); when that is below half an lp ulp "
        "u of the result, |acc_ref - acc_torch| < u/2 and two round-to-nearest results of "
        "values closer than u are at most 1 ulp apart.",
        fmt="bfloat16",
    ),
    Claim(
        "amp.linear_fp16",
        "amp",
        "As amp.linear_bf16, under float16 autocast: within 1 float16 ulp where the float32 "
        "accumulation bound is below half a float16 ulp.",
        "ulps",
        1,
        "The derivation of amp.linear_bf16 with the float16 ulp (2^-10 relative, 2^-24 "
        "absolute in the subnormal range).",
        fmt="float16",
    ),
    Claim(
        "amp.activation_bf16",
        "amp",
        "GELU (erf and tanh), Tanh and ReLU on a bfloat16 tensor under autocast: forward "
        "output and input gradient within 1 bfloat16 ulp of torch's wherever the float32 "
        "bound of the nn claims (8 eps |x| forward, 8 eps |g| (1 + |x| (1 + x^2)) backward) "
        "is below half a bfloat16 ulp of the result (the check counts the others: GELU's "
        "negative tail, where |y| << |x| and float32 cancellation dominates).",
        "ulps",
        1,
        "Both compute in float32 and round once to lp. The float32 results differ by at most "
        "the nn.tanh/nn.gelu*/nn.relu bounds (<= 8 eps S); where that is below half an lp "
        "ulp u of the result, the two values are closer than u and their round-to-nearest "
        "images are at most 1 ulp apart.",
        fmt="bfloat16",
    ),
    Claim(
        "amp.activation_fp16",
        "amp",
        "As amp.activation_bf16 on float16 tensors: within 1 float16 ulp under the same "
        "precondition.",
        "ulps",
        1,
        "As amp.activation_bf16, with the float16 ulp.",
        fmt="float16",
    ),
    Claim(
        "amp.model",
        "amp",
        "The compact model's forward output and parameter gradients under autocast (bf16 and "
        "fp16; depth 3, width 64) agree with torch's after dividing both by max|torch's| of "
        "each tensor, within atol = 16 * 2^-11 (0.0078).",
        "close",
        (0.0, 16 * 2.0**-11),
        "Each op adds at most 1 lp ulp (amp.linear_*, amp.activation_*), i.e. a relative "
        "2^-8 (bf16) or 2^-11 (fp16) of the tensor's scale; the forward has 2L - 1 = 5 lp ops "
        "and a gradient passes through at most 2L = 6 more, each propagating the earlier "
        "differences with gain <= 1 for these unit-scale layers; 16 ulps of fp16 leaves room "
        "for that. bf16 is held to the same number (observed: 0).",
    ),
)

LOSS_SCALING_CLAIMS: tuple[Claim, ...] = (
    Claim(
        "loss_scaling.update_rule",
        "loss_scaling",
        "For any scale (float32, subnormals and near-max included), tracker, found_inf and "
        "hyperparameters (non-power-of-two factors, any growth_interval), one update of "
        "reference.loss_scaling.GradScaler gives the same scale bits and tracker as "
        "torch._amp_update_scale_.",
        "bits",
        0,
        "The rule is integer logic plus one float64 product rounded to float32 (NOTE [ Scale "
        "update rounding ]); NumPy's float64 multiply and float32 cast are IEEE, as C++'s.",
    ),
    Claim(
        "loss_scaling.unscale",
        "loss_scaling",
        "Unscaling float32, float64 and float16 gradients (finite across magnitudes, +-inf, "
        "NaN) by any float32 scale gives the same bits and the same found_inf as "
        "torch._amp_foreach_non_finite_check_and_unscale_.",
        "nan_class",
        0,
        "inv = f32(1/f64(S)) then one multiply per element in the gradient's opmath type "
        "(NOTE [ Unscale by reciprocal ]): each step is one IEEE rounding. NaN payloads are "
        "not compared.",
    ),
    Claim(
        "loss_scaling.scaler",
        "loss_scaling",
        "Driven by the same gradient stream (finite across magnitudes, +inf, -inf, NaN in any "
        "tensor; unscale_ explicit or inside step; state_dict save/load across the two "
        "implementations; random hyperparameters), the reference and torch GradScalers hold "
        "the same scale, growth tracker, skip decisions, unscaled gradients and SGD "
        "parameters after every step.",
        "nan_class",
        0,
        "Composition of loss_scaling.update_rule, loss_scaling.unscale and optim.sgd (bit-"
        "exact SGD); the skip decision is the same found_inf flag. NaN payloads are not "
        "compared.",
    ),
    Claim(
        "loss_scaling.underflow_mask",
        "loss_scaling",
        "float16 autocast without loss scaling: the set of parameter-gradient elements that "
        "are exactly zero (underflow) is the same in the reference and torch, layer by layer.",
        "bits",
        0,
        "An element is zero when its lp result rounds below 2^-25. The implementations agree "
        "within 1 lp ulp per op (amp.linear_fp16), so a mask can differ only where one side "
        "holds the smallest subnormal 2^-24 and the other 0; the test records how many "
        "elements sit at +-2^-24 (the edge is reached) and requires equal masks.",
    ),
    Claim(
        "loss_scaling.train",
        "loss_scaling",
        "A 60-step SGD run (lr 0.1) of the compact model (fp16 with a GradScaler, bf16 and "
        "fp32 without; grad clipping at 1.0) in both implementations: the loss falls by more "
        "than 75% in each (observed 81-82%), every step's scale and skip decision are equal, "
        "and parameters agree within atol = 0.2 (rtol 0).",
        "close",
        (0.0, 0.2),
        "With clipping, |g|_inf <= 1; the two gradients differ by at most ~4 lp ulps of that "
        "(amp.model: 4 * 2^-7 for bf16, the larger), so one SGD step (lr 0.1) moves the two "
        "parameter vectors apart by <= 0.1 * 0.031 = 0.0031, and 60 steps by <= 0.19 if "
        "the differences add up without cancellation or amplification (a contracting, "
        "well-conditioned regression). Skips and scales are equal when no gradient lies "
        "within that bound of float16 overflow (checked by the equality itself).",
    ),
)

RECOMPUTE_CLAIMS: tuple[Claim, ...] = (
    Claim(
        "recompute.grads_reference",
        "recompute",
        "Under every schedule (none, uniform:K, sqrt, optimal:S), with dropout on, the "
        "reference's parameter and input gradients are bit-identical to running without "
        "checkpointing, and the generators end in the same state.",
        "bits",
        0,
        "The recompute re-runs the same NumPy operations on the same input and weights, with "
        "the generators restored so Dropout draws the same masks (NOTE [ RNG replay ]): every "
        "tensor backward reads is bit-identical, and so is every gradient.",
    ),
    Claim(
        "recompute.grads_torch",
        "recompute",
        "Under every schedule, torch.utils.checkpoint (use_reentrant=False, "
        "preserve_rng_state=True; nested for optimal:S) gives gradients bit-identical to the "
        "same model without checkpointing, dropout on.",
        "bits",
        0,
        "The recompute runs the same kernels on the same inputs with the stashed CPU RNG "
        "state, so nn.Dropout draws the same noise; CPU kernels are deterministic for a "
        "fixed shape and thread count.",
    ),
    Claim(
        "recompute.held_bytes",
        "recompute",
        "The bytes held between forward and backward (distinct storage, parameters "
        "excluded) predicted from the reference tape equal what torch's saved_tensors_hooks "
        "see packed, for every schedule.",
        "bits",
        0,
        "Byte counts are integers: the tape holds segment inputs plus the tapes of layers "
        "run normally (nn.saved_tensors gives the latter per layer); any difference is a "
        "design mismatch, not rounding.",
    ),
    Claim(
        "recompute.counts",
        "recompute",
        "Per layer, the forwards run during backward by the reference equal the forwards "
        "torch starts (forward pre-hooks) during backward, for every schedule.",
        "bits",
        0,
        "Counts are integers. Both stop a recompute after the last layer that saves "
        "(NOTE [ Early stop ]): torch interrupts that layer inside its forward, after its "
        "saves, so it is counted as started, and the reference runs it whole.",
    ),
    Claim(
        "recompute.early_stop",
        "recompute",
        "Per layer, torch's finished forwards during backward (forward hooks) equal the "
        "reference's count minus the recomputes in which that layer is its segment's last "
        "saving layer (where torch's early stop interrupts it).",
        "bits",
        0,
        "Counts are integers; the interruption happens in every recompute of a segment, at "
        "the pack of the last tensor the forward saved (NOTE [ Early stop ]).",
    ),
    Claim(
        "recompute.plans",
        "recompute",
        "For every spec and 1 <= n <= 64 layers the two trees' parse_schedule give the same "
        "plan; optimal:S's recompute count equals Griewank-Walther's closed form "
        "r n - beta(S + 1, r - 1).",
        "bits",
        0,
        "Plans are integers; the reference minimizes over every first split and the torch "
        "twin takes the binomial formula's largest optimal split, so equal plans check the "
        "formula against the search.",
    ),
)

RESUME_CLAIMS: tuple[Claim, ...] = (
    Claim(
        "resume.cross_impl_state",
        "resume",
        "A reference training state mapped to torch (torch_impl.resume.state_from_reference), "
        "saved and loaded as a torch checkpoint, loaded into torch.nn / torch.optim / "
        "lr_scheduler objects, read back with their state_dict() and mapped home "
        "(state_to_reference) equals the original in every parameter, optimizer buffer, step "
        "count, lr, scheduler field, scaler value, data position and counter, bit for bit.",
        "bits",
        0,
        "Every step is a copy: the same keys and (out, in) layouts on both sides, tensors "
        "made from the arrays' bytes (torch.from_numpy of a copy, .numpy() back), Python "
        "floats and ints copied as objects; no arithmetic touches a value. Random streams "
        "are not mapped (NOTE [ Cross-implementation mapping ]) and not compared.",
    ),
)

TRAIN_CLAIMS: tuple[Claim, ...] = (
    Claim(
        "train.resume_exact",
        "train",
        "In each implementation, a run interrupted at any step (checkpoint written, every "
        "object dropped, resumed from the file) ends in the same complete state as the "
        "uninterrupted run: parameters, optimizer buffers, lr schedule, loss scale and "
        "tracker, random streams, data position and counters, for fp32, bf16 and fp16, with "
        "dropout and recomputation.",
        "bits",
        0,
        "The resumed run executes the same operations on the same bits: the checkpoint holds "
        "every value the next step reads (the inventory in reference/train.py) and restores "
        "it by copy; the data order is a hash of (seed, epoch); nothing reads the global RNG "
        "(NOTE [ Dropout's stream is the default generator ]). Same process kind, same "
        "kernels, so no rounding can differ.",
    ),
    Claim(
        "train.kill_resume",
        "train",
        "A `python -m parity train` process SIGKILLed at arbitrary moments while it writes a "
        "checkpoint every step, then restarted with --resume, prints the same state-sha256 "
        "as an uninterrupted process, and no kill leaves a checkpoint that fails to load.",
        "bits",
        0,
        "Atomic writes (NOTE [ Atomic write ]) leave either the old or the new file under a "
        "checkpoint's name, and the resumed run is exact (train.resume_exact); the digest "
        "is a function of the bits of the final state.",
    ),
    Claim(
        "train.digest_cross_impl",
        "train",
        "reference.train.state_digest of a reference state equals "
        "torch_impl.train.state_digest of the same state mapped to torch "
        "(state_from_reference): the canonical digest is implementation-independent.",
        "bits",
        0,
        "Both hash the same length-prefixed records (NOTE [ Canonical state digest ]) built "
        "from the same bytes (the mapping is lossless: resume.cross_impl_state) and the same "
        "Python reprs of the scaler's floats and ints.",
    ),
)

CLAIMS: tuple[Claim, ...] = (
    FORMATS_CLAIMS + NN_CLAIMS + OPTIM_CLAIMS + DATA_CLAIMS + AMP_CLAIMS + LOSS_SCALING_CLAIMS
    + RECOMPUTE_CLAIMS + RESUME_CLAIMS + TRAIN_CLAIMS
)

_BY_ID = {c.id: c for c in CLAIMS}
if len(_BY_ID) != len(CLAIMS):
    raise RuntimeError("duplicate claim ids in parity/tolerances.py")


def claim(claim_id: str) -> Claim:
    """The claim with this id (KeyError names the known ids of the same topic)."""
    try:
        return _BY_ID[claim_id]
    except KeyError:
        topic = claim_id.split(".", 1)[0]
        known = sorted(c.id for c in CLAIMS if c.topic == topic) or sorted(_BY_ID)
        raise KeyError(f"unknown claim {claim_id!r}; known: {', '.join(known)}") from None
