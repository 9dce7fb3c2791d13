"""The nvfp4 claims (the kinds and the registry: parity/tolerances.py).

Transformer Engine's NVFP4 recipe (reference/nvfp4.py) is a chain of float32 operations each
rounded once, nearest-even casts to e4m3 and fp4, and exact ones (max, clamps, products by
+-1/4, floors of powers of two): every step is correctly rounded in both trees, so they agree
bit for bit, but for NaN patterns, which NumPy, ml_dtypes and torch write differently. The
rule itself is held to TE's source as docs/sources/block_scaling.md section 1 reads it,
written apart in the test in float64 steps rounded to float32 with ml_dtypes' casts; the RHT
to exact arithmetic and a derived bound; stochastic rounding to its exact expectation.
"""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

# rht_inverse(rht(x)) against x, per element, in units of bfloat16's eps 2^-7 times G, the
# max |x| of the element's group of 16: the derivation is rht_roundtrip's reason
RHT_ROUNDTRIP_BOUND = 2.52

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="nvfp4.twins",
        statement=(
            "torch_impl.nvfp4 gives the reference's bits: quantize's fp4 codes, e4m3 scale codes "
            "and global amax for both tiles (1x16, 16x16), nearest-even, stochastic (on the same "
            "rbits) and DeepGEMM's ties-down rounding, Four Over Six on and off, with and without "
            "the RHT; dequantize's float32 values; round_fp4_stochastic's values; rht's and "
            "rht_inverse's bfloat16 outputs; on the edge tensors (all zero, one inf, one NaN, a "
            "block far below the amax, subnormals, amaxes at powers of two, an amax below 2688 / "
            "FLT_MAX, a Four Over Six tie, shapes the tiles do not divide) and under hypothesis; "
            "NaN as a class, and codes wherever the value decodes to a number."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "The same float32 operations in the same order, each correctly rounded by NumPy "
            "and by torch (divisions, products, sums, the min / clamp, floor), the e4m3 cast "
            "torch's own against the reference's encoder (one nearest-even rounding, "
            "formats.small_*), the fp4 rounding torch_impl.mx's against the same encoder "
            "(mx.twins): no step can differ. Codes are integers, compared bit for bit. NaN "
            "patterns are not the math's: torch writes 0xFFFF for every bfloat16 NaN where "
            "ml_dtypes keeps the float32 NaN's top bits, and 0 * inf's sign is the platform's; "
            "a NaN's fp4 code is the zero of its opposite sign, so after the RHT of an inf "
            "the codes of NaN elements (in blocks whose scale is NaN) follow those patterns."
        ),
    ),
    Claim(
        id="nvfp4.mx_1x16",
        statement=(
            "For tile (1, 16), nearest even, no Four Over Six, quantize's codes and scale codes "
            "are mx.to_nvfp4's (variant transformer_engine) and dequantize's values "
            "mx.from_nvfp4's, in each tree against its own mx, on the edge tensors and under "
            "hypothesis: the topic's 1x16 path is the mx topic's NVFP4, NaN as a class."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Two statements of the same rule (TE's 1x16 chain, mx.nvfp4_te) written "
            "separately, each step one correctly rounded float32 operation in the same "
            "order, so the same bits; a NaN value's pattern is the multiplication's, hence "
            "NaN as a class (codes and scales are integers: bit for bit)."
        ),
    ),
    Claim(
        id="nvfp4.te_rule",
        statement=(
            "reference.nvfp4.quantize and dequantize are Transformer Engine's NVFP4 recipe as "
            "docs/sources/block_scaling.md section 1 reads it from TE d0067d0 (1.2 to 1.6, "
            "1.9, 1.10), computed apart tile by tile on a zero-padded copy: S_enc = "
            "f32(2688 / A) (1536 under Four Over Six) capped at FLT_MAX, 1 at A = 0 or S_enc = "
            "0; S = e4m3(min(amax f32(S_enc f32(1/6)), 448)) with no lower clamp, amax over "
            "the 1x16 block or the 16x16 tile; R = min(f32(1 / f32(S S_dec)), FLT_MAX); fp4 "
            "of clamp(x R, +-6); values P f32(f32(S A) f32(1 / 2688)); Four Over Six's two "
            "candidates, their MAE in element order, a tile's rows tree-summed, a tie to map "
            "6; round_fp4_stochastic is TE's software rule element by element. Scale codes and "
            "values agree NaN as a class, codes wherever x R is a number; and TE's edge cases "
            "hold as stated values: a zero tensor gives zeros, a block below 2^-10 of the "
            "scale range gets S = 0 and codes +-6 that decode to 0, an inf gives S_enc = 1, "
            "S = 448, code 7 and infinite values, an A of 1e-36 decodes 8x too small."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Each step is one IEEE float32 operation (the oracle: the float64 result of two "
            "float32 operands rounded to float32 by NumPy, which is the float32 result as 53 "
            ">= 2 * 24 + 2; the stochastic t = |a| + u step likewise, u step being exact) or "
            "a nearest-even cast (ml_dtypes' float8_e4m3fn and float4_e2m1fn after an "
            "explicit clamp; the reference's encoder, formats.small_*). A NaN into fp4 is a "
            "choice (TE's table writes +0, the reference the zero of the opposite sign) in a "
            "block whose scale is NaN anyway, hence codes compared where x R is a number."
        ),
    ),
    Claim(
        id="nvfp4.rht_orthogonal",
        statement=(
            "The RHT matrix M = diag(s) H / 4 of each tree is TE's: hadamard(16) is "
            "Sylvester's, H[i][j] = (-1)^popcount(i & j), SIGN_VECTOR TE's 16 signs "
            "(get_wgrad_sign_vector, the mask 0xD7E8), every entry +-1/4, and M M^T is the "
            "identity exactly."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The entries are +-1/4, so each entry of M M^T is a sum of 16 products +-1/16, "
            "all exact in float64 (and float32): the product is the identity with no "
            "rounding, and any wrong sign or entry shows as a bit."
        ),
    ),
    Claim(
        id="nvfp4.rht_roundtrip",
        statement=(
            "rht_inverse(rht(x)) recovers bfloat16 x within 2.52 eps(bfloat16) G per element "
            "(= 5.04 * 2^-8 G), G the max |x| of the element's group of 16, for groups with "
            "G in [2^-100, 2^120], in both trees."
        ),
        kind="eps",
        bound=RHT_ROUNDTRIP_BOUND,
        scale="G, the max |x| of the element's group of 16",
        reason=(
            "u = 2^-8 (bfloat16's half ulp, eps / 2), g = 15 * 2^-24 / (1 - 15 * 2^-24) "
            "(a float32 sum of 16 exact terms), ||x||_2 <= 4 G. Forward: each y_j is x M's "
            "entry summed (error <= g sum|x_i| / 4 <= 4 g G) and rounded once (u |y_j|), so "
            "sum_j |y_j - (xM)_j| <= u sum_j |(xM)_j| + 64 (1 + u) g G <= 4 u ||x||_2 + ... "
            "= 16 u G + 64 (1 + u) g G. Inverse: M is orthogonal, so the exact (y M^T)_i is "
            "x_i plus the forward errors times +-1/4: within 4 u G + 16 (1 + u) g G; its "
            "float32 sum adds <= 4 (1 + u) g G, its bfloat16 rounding <= u (G + 4 u G). In "
            "all <= u G (5 + 4 u) + 20 (1 + u) g G = 5.0202 u G = 2.510 eps G; rounded up to "
            "2.52 (bfloat16 subnormals add <= 2^-134 absolute, below 2^-26 u G at G >= "
            "2^-100; G <= 2^120 keeps every sum finite)."
        ),
    ),
    Claim(
        id="nvfp4.sr_unbiased",
        statement=(
            "round_fp4_stochastic on uniform rbits has its exact expectation: for 8 values a "
            "(negative, on the grid, at 1/256 and 255/256 of a step, between, in each of the "
            "grid's three spacings) over n = 2^20 seeded draws each, the count of draws "
            "rounded up is Binomial(n, floor(256 f) / 256), f the position of |a| in its grid "
            "step, so E[q] = lo + step floor(256 f) / 256: a, up to the 8-bit draw's "
            "quantization (below step / 256)."
        ),
        kind="statistical",
        bound=1e-9,
        reason=(
            "r uniform on 0..255 rounds up iff r >= 256 - floor(256 f) (the rule's t = |a| + "
            "u step crosses the next grid point; the test checks t is exact for every r), so "
            "up-counts K are Binomial(n, p) exactly. The observation is 8 times the smallest "
            "two-sided p-value, each bounded by Chernoff's exp(-n KL(p +- d || p)) with d = "
            "|K / n - p| (no approximation; Bonferroni over the 8): a correct rule fails with "
            "probability <= 1e-9 (and, the seed fixed, never twice). Power: KL >= 2 d^2, so a "
            "bias of 0.0067 (1.7 / 256) in the probability of rounding up, a mean bias of "
            "0.0067 step, fails with probability >= 1 - 2e-10; at p = 1/256 a rule rounding "
            "up one draw fewer (r > threshold) never rounds up: p <= exp(-4104)."
        ),
    ),
    Claim(
        id="nvfp4.four_over_six",
        statement=(
            "quantize(four_over_six=True) keeps, in every block (a 16x16 tile as a whole), "
            "the candidate whose error (MAE in float32, computed apart) is the smaller: the "
            "kept candidate's error is min(err4, err6) bit for bit, and where the two errors "
            "tie and the scales differ the kept scale is map 6's, in both trees."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The errors are recomputed in the test from the two candidates (float64 steps "
            "rounded to float32, the sum in element order, a tile's rows tree-summed): the "
            "same float32 values the trees compare, so min(err4, err6) is an exact float32 "
            "number the kept candidate must equal; a tie is decided by TE's strict '<'."
        ),
    ),
)

_TWINS = ("nvfp4.twins",)
_same = Twin.same

MANIFEST = Manifest(
    topic="nvfp4",
    modules=("reference.nvfp4", "torch_impl.nvfp4"),
    rows=(
        _same("nvfp4", "TILES", *_TWINS, "nvfp4.te_rule"),
        _same("nvfp4", "ROUNDINGS", *_TWINS),
        _same("nvfp4", "FOUR_OVER_SIX_E4M3_MAX", *_TWINS, "nvfp4.te_rule"),
        _same("nvfp4", "SIGN_VECTOR", "nvfp4.rht_orthogonal"),
        _same("nvfp4", "hadamard", "nvfp4.rht_orthogonal"),
        _same("nvfp4", "rht_matrix", "nvfp4.rht_orthogonal"),
        _same("nvfp4", "rht", *_TWINS, "nvfp4.rht_roundtrip"),
        _same("nvfp4", "rht_inverse", *_TWINS, "nvfp4.rht_roundtrip"),
        _same("nvfp4", "global_scales", *_TWINS, "nvfp4.te_rule"),
        _same("nvfp4", "block_amax", *_TWINS, "nvfp4.te_rule"),
        _same("nvfp4", "round_fp4_stochastic", *_TWINS, "nvfp4.te_rule", "nvfp4.sr_unbiased"),
        _same("nvfp4", "quantize", *_TWINS, "nvfp4.mx_1x16", "nvfp4.te_rule",
              "nvfp4.four_over_six"),
        _same("nvfp4", "dequantize", *_TWINS, "nvfp4.mx_1x16", "nvfp4.te_rule"),
    ),
    headline="parity/test_nvfp4.py::test_nvfp4_1x16_gives_the_same_codes_scales_and_amax_in_both_trees",
)
