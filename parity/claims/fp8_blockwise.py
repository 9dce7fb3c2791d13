"""The fp8_blockwise claims (the kinds and the registry: parity/tolerances.py).

Blockwise quantization (reference/fp8_blockwise.py) is a max, a clamp, one division in
float32 or float64 rounded once, a float32 product, an exact clamp and a nearest-even cast,
per tile: every rounding is correctly rounded, so the trees agree bit for bit. The three
variants are each held to their library's rule as the research notes read it from source
(DeepGEMM, torchao 0.18.0, Transformer Engine; none of them runs here), written apart in the
test in float64 arithmetic rounded to float32 after each step, with ml_dtypes' cast; where
those produce a NaN, its sign is the platform's, hence NaN as a class.
"""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

_ORACLE = (
    "Each step of the rule is done in float64 and rounded to float32 (a float64 product or "
    "quotient of two float32 values, rounded once to float32, is the correctly rounded "
    "float32 result: float64 has more than 2 * 24 + 2 bits), the cast is ml_dtypes' "
    "float8_e4m3fn after an explicit clamp to +-448, the amax a loop over each tile: another "
    "form of the same correctly rounded operations, so the same values; a NaN made by inf * "
    "0 or carried from an input has the sign the platform gives, hence NaN as a class."
)

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="fp8_blockwise.twins",
        statement=(
            "Blockwise quantization to float8_e4m3fn gives the same codes and float32 scales "
            "in both trees, bit for bit, for every variant (deepseek, torchao, "
            "transformer_engine) and tile (1x128, 128x128, and small ones over shapes not "
            "divisible by them): on the edge tiles (all zero, one +-inf, one NaN, amax at and "
            "beside 448, powers of two and FLT_MAX, subnormal amaxes, amaxes below each "
            "variant's epsilon) and any float32 matrix."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Both trees do the same correctly rounded operations in the same order (float32 "
            "or float64 division rounded to float32, a float32 product, a clamp, a nearest-"
            "even cast) and exact ones (max, padding with zeros, the power-of-two mask, the "
            "reciprocal of a power of two); the cast of a NaN gives the one NaN code 0x7F "
            "or 0xFF by its sign, and no NaN is made before the product, where both trees "
            "compute inf * 0 on the same hardware; measured equal, NaN codes included."
        ),
    ),
    Claim(
        id="fp8_blockwise.dequantize",
        statement=(
            "dequantize_blockwise (each code times its tile's scale, float32) gives the same "
            "values in both trees, for every variant and tile, NaN as a class."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "One float32 product of an exact e4m3 value and a float32 scale: correctly "
            "rounded on both sides; a NaN code, or 0 times an infinite scale (torchao's tile "
            "with an inf), makes a NaN whose sign NumPy and torch set differently."
        ),
    ),
    Claim(
        id="fp8_blockwise.deepseek",
        statement=(
            "The deepseek variant is DeepGEMM's per_token_cast_to_fp8 / per_block_cast_to_fp8 "
            "(commit 54e2261): amax clamped to >= f32(1e-4), sf = f32(amax / 448), codes "
            "e4m3(clamp(f32(x f32(1 / sf)))), stored sf; a zero tile gets sf = "
            "f32(f32(1e-4) / 448) and codes 0, an inf element NaN and the rest of its tile 0, "
            "a NaN element a NaN scale and a NaN tile."
        ),
        kind="nan_class",
        bound=0,
        reason=_ORACLE,
    ),
    Claim(
        id="fp8_blockwise.torchao",
        statement=(
            "The torchao variant is torchao 0.18.0's torch_blockwise_scale_act_quant_lhs / "
            "torch_blockwise_scale_weight_quant: s = f32(448 / max(f64(amax), 1e-12)), codes "
            "e4m3(clamp(f32(x s), +-448)), stored f32(1 / s); a zero tile gets s = "
            "f32(4.48e14) and codes 0, an amax below 1e-12 the same s, an inf element s = 0, "
            "stored scale inf and a tile decoding to NaN."
        ),
        kind="nan_class",
        bound=0,
        reason=_ORACLE,
    ),
    Claim(
        id="fp8_blockwise.transformer_engine",
        statement=(
            "The transformer_engine variant is TE Float8BlockScaling's kernel (power-of-two "
            "scales, amax_epsilon 0; recipe_common.cuh, commit d0067d0): amax by fmaxf (NaN "
            "dropped), scale 1 for an amax 0, inf or NaN, else f32(448 / amax) (FLT_MAX if "
            "inf) rounded down to a power of two, stored f32(1 / scale); a zero tile gets "
            "scale 1, an inf element scale 1 and that element 448, a NaN element NaN alone."
        ),
        kind="nan_class",
        bound=0,
        reason=_ORACLE + " The round-down is math.frexp in the oracle, a bit mask in the trees.",
    ),
    Claim(
        id="fp8_blockwise.disagreements",
        statement=(
            "The table in docs/fp8.md, section Blockwise fp8, is what the reference computes "
            "on the edge tiles: for each input class, how many elements decode to different "
            "values (NaN as one value) under each pair of variants."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Counts are integers, computed from the reference's codes and scales on a fixed "
            "seed's tiles and compared with the committed table: any change to a rule or to "
            "the edge tiles that moves a count shows."
        ),
    ),
    Claim(
        id="fp8_blockwise.gemm_twins",
        statement=(
            "blockwise_mm (a's 1x128 tiles times b's 128x128 blocks, the exact product of each "
            "128-element chunk of K rounded to float32, scaled by f32(a_scale * b_scale), "
            "added to a float32 sum) gives the same float32 outputs in both trees, bit for "
            "bit (NaN as a class), for every quantization variant, K a multiple of 128 or "
            "not, N not a multiple of 128, on codes with NaN and scales with inf."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Each chunk's float64 matmul of e4m3 values is exact in any order of addition "
            "(NOTE [ The chunk sum is exact ] in reference/fp8_blockwise_gemm.py), so NumPy's "
            "and torch's BLAS give the same float64 numbers; the rest is the same correctly "
            "rounded float32 operations (a rounding to float32, two products, one sum) in "
            "the same order; a NaN code or 0 times an inf scale makes a NaN whose sign the "
            "library sets, hence NaN as a class."
        ),
    ),
    Claim(
        id="fp8_blockwise.gemm_rule",
        statement=(
            "The reference blockwise_mm is its docstring's rule, DeepGEMM's promotion (sm90_"
            "fp8_gemm_1d2d.cuh, commit 54e2261): per chunk c of 128 along K, y = f32(y + "
            "f32(f32(sa_ic sb_cj) f32(P_c))), P_c the chunk's exact dot product of decoded "
            "codes, chunks in increasing order from y = 0."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The test writes the rule apart, one output at a time: P_c as math.fsum of "
            "Python float products of the decoded codes (each product and the sum exact, "
            "NOTE [ The chunk sum is exact ]), then NumPy float32 scalars for the three "
            "roundings: the same correctly rounded operations, so the same bits."
        ),
    ),
    Claim(
        id="fp8_blockwise.gemm_bound",
        statement=(
            "blockwise_mm's Y is within (gamma_{C+2}(u) + gamma_K(2^-53)) |A| |B| of the "
            "float64 product of the exactly dequantized operands A, B (C = ceil(K / 128) "
            "chunks, u = 2^-24), for every variant's codes and scales, same-sign operands and "
            "N(0, 1) ones, K from 256 (C = 2) to 4096."
        ),
        kind="eps",
        bound=1.0,
        scale="(gamma_{C+2}(u) + gamma_K(2^-53)) |A||B| / eps, u = 2^-24, eps = 2^-52",
        reason=(
            "NOTE [ Blockwise GEMM error budget ] in parity/claims/fp8_blockwise_bounds.py: "
            "per chunk three float32 roundings of an exact sum (promotion, scale product, "
            "scaling), then C - 1 float32 additions, (1 + theta_3)(1 + theta_{C-1}) = 1 + "
            "theta_{C+2} (Higham 3.3), against a float64 truth within gamma_K(2^-53) |A||B|; "
            "no probabilistic term, no underflow on the tested operands. Reached: same-sign "
            "operands at C = 2 spend more than half of it."
        ),
    ),
    Claim(
        id="fp8_blockwise.gemm_variants_agree",
        statement=(
            "Where every tile's amax is 448 * 2^k (k in [-10, 10]), the three variants give "
            "the same codes and scales and so blockwise_mm the same outputs, bit for bit."
        ),
        kind="bits",
        bound=0,
        reason=(
            "At amax = 448 * 2^k each rule's scale is the power of two 2^k, exactly: "
            "DeepSeek's f32(amax / 448), torchao's f32(1 / f32(448 / amax)) and TE's "
            "448 / amax rounded down to a power of two (already one); x * 2^-k is exact, so "
            "the codes are the same, and the GEMM a function of codes and scales."
        ),
    ),
    Claim(
        id="fp8_blockwise.gemm_disagreements",
        statement=(
            "The GEMM table in docs/fp8.md, section Blockwise fp8, is what the reference "
            "computes: for each input class (parity/strategies/fp8_blockwise.py "
            "blockwise_gemm_operands), how many of blockwise_mm's outputs differ (NaN as one "
            "value) under each pair of quantization variants."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Counts are integers, computed from the reference on a fixed seed's operands and "
            "rendered into the page by python -m parity docs; the test recomputes them against "
            "the committed page: any change to a rule or to the operands that moves a count "
            "shows."
        ),
    ),
)

_TWINS = ("fp8_blockwise.twins",)
_VARIANTS = ("fp8_blockwise.deepseek", "fp8_blockwise.torchao",
             "fp8_blockwise.transformer_engine")
_GEMM = ("fp8_blockwise.gemm_twins", "fp8_blockwise.gemm_rule", "fp8_blockwise.gemm_bound")
_same = Twin.same

MANIFEST = Manifest(
    topic="fp8_blockwise",
    modules=("reference.fp8_blockwise", "torch_impl.fp8_blockwise",
             "reference.fp8_blockwise_gemm", "torch_impl.fp8_blockwise_gemm"),
    rows=(
        _same("fp8_blockwise", "TILE_1x128", *_TWINS),
        _same("fp8_blockwise", "TILE_128x128", *_TWINS),
        _same("fp8_blockwise", "VARIANTS", *_TWINS, *_VARIANTS),
        _same("fp8_blockwise", "E4M3_MAX", *_TWINS),
        _same("fp8_blockwise", "DEEPSEEK_EPS", *_TWINS, "fp8_blockwise.deepseek"),
        _same("fp8_blockwise", "TORCHAO_EPS", *_TWINS, "fp8_blockwise.torchao"),
        _same("fp8_blockwise", "FLT_MAX", *_TWINS, "fp8_blockwise.transformer_engine"),
        _same("fp8_blockwise", "block_amax", *_TWINS),
        _same("fp8_blockwise", "block_scales", *_TWINS, *_VARIANTS),
        _same("fp8_blockwise", "quantize_blockwise", *_TWINS, *_VARIANTS,
              "fp8_blockwise.disagreements"),
        _same("fp8_blockwise", "dequantize_blockwise", "fp8_blockwise.dequantize"),
        _same("fp8_blockwise_gemm", "CHUNK", *_GEMM),
        _same("fp8_blockwise_gemm", "blockwise_mm", *_GEMM, "fp8_blockwise.gemm_variants_agree",
              "fp8_blockwise.gemm_disagreements"),
    ),
    headline="parity/test_fp8_blockwise.py::"
             "test_blockwise_1x128_gives_the_same_codes_and_scales_in_both_trees",
)
