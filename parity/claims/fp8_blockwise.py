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
)

_TWINS = ("fp8_blockwise.twins",)
_VARIANTS = ("fp8_blockwise.deepseek", "fp8_blockwise.torchao",
             "fp8_blockwise.transformer_engine")
_same = Twin.same

MANIFEST = Manifest(
    topic="fp8_blockwise",
    modules=("reference.fp8_blockwise", "torch_impl.fp8_blockwise"),
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
    ),
    headline="parity/test_fp8_blockwise.py::"
             "test_blockwise_1x128_gives_the_same_codes_and_scales_in_both_trees",
)
