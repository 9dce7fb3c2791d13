"""The mx claims (the kinds and the registry: parity/tolerances.py).

torchao 0.18 is the oracle (parity/test_mx_torchao.py, on CPU; its eager code is the same
on CUDA except RCEIL's inline PTX on sm_100+ under torch.compile, which computes the exact
"rceil" rule of reference/mx.py rather than "rceil_log2f"). parity/test_mx.py holds the two
trees to each other. On CUDA torch.log2 is CUDA's log2f, whose rounding near the integers
was not measured here: mx.rceil_log2f, and so the rceil_log2f half of mx.twins, are CPU
statements; every other step is integer or exactly rounded arithmetic on either device.
"""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="mx.torchao",
        extra="torchao",
        statement=(
            "reference.mx.to_mx(variant='torchao') gives the E8M0 scale codes and the element "
            "codes of torchao 0.18's to_mx (fp4 unpacked from torchao's two-per-byte "
            "packing, and the packed bytes themselves), for float32 and bfloat16 input and every "
            "element format (float8_e4m3fn, float8_e5m2, fp6 e2m3 and e3m2, fp4 e2m1) under "
            "FLOOR, CEIL, EVEN and RCEIL (the reference's rceil_log2f), on edge blocks (amax "
            "at, just below and just above a power of two and the element max, zero blocks, "
            "a single NaN or inf, subnormal-only blocks, outliers, the smallest scales) and "
            "under hypothesis; elements are compared in every block whose scale is not NaN. "
            "reference.mx.from_mx gives torchao's to_dtype float32 values, NaN as a class."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The scale rules are integer arithmetic on amax's float32 word, the same integer "
            "steps torchao takes (rceil_log2f: ceil of a correctly rounded float32 log2, "
            "mx.rceil_log2f); the division by a power of two is exact, bar a float32 "
            "subnormal quotient that rounds to zero in every element format either way; the "
            "element rounding is reference.formats' nearest-even encoder (bit-exact against "
            "ml_dtypes, formats.small_*), torchao's a bit trick computing the same rounding. "
            "In a NaN-scale block torchao's fp4/fp6 bit trick writes an arbitrary code for "
            "the NaN (0x3 for +NaN into fp4): the block decodes to NaN whatever the elements."
        ),
    ),
    Claim(
        id="mx.nvfp4_torchao",
        extra="torchao",
        statement=(
            "reference.mx.to_nvfp4(variant='torchao') gives the float8_e4m3fn block-scale codes "
            "and the fp4 codes "
            "of torchao 0.18's nvfp4_quantize, with one scale level and with the per-tensor "
            "scale amax / (448 * 6) (per_tensor_amax_to_scale), on edge blocks and under "
            "hypothesis; elements compared wherever the block's scale and the element's scaled "
            "value are numbers (NOTE [ NVFP4 below 2^-116 ]: a tensor whose amax is below about "
            "2^-116.6 makes 1 / g infinite and its zeros NaN, which fp4 cannot hold)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The same float32 operations in the same order, each rounded once by IEEE 754 in "
            "both (amax / 6, the clamp, the e4m3 cast, 1 / S or (1 / g) / S, x * R, the clamp, "
            "the fp4 rounding): NumPy's float32 arithmetic and torch's CPU kernels both round "
            "correctly, so no step can differ."
        ),
    ),
    Claim(
        id="mx.nvfp4_te",
        statement=(
            "reference.mx.to_nvfp4's default (variant 'transformer_engine') is Transformer "
            "Engine's NVFP4 training recipe (1x16 blocks) as its reference quantizer states "
            "it (transformer_engine/pytorch/custom_recipes/reference_nvfp4.py, read at "
            "d0067d0, 2.20.0.dev0), computed apart from it block by block: S_enc = "
            "min(2688 / A, FLT_MAX), 1 at A = 0 or S_enc = 0; S = e4m3(min(amax (S_enc "
            "f32(1/6)), 448)) with no lower clamp; R = min(1 / (S S_dec), FLT_MAX); the fp4 "
            "codes of clamp(x R, +-6); from_nvfp4 is its dequantize, (S A) f32(1/2688). Scale "
            "codes, element codes and values agree, NaN as a class, on edge blocks, on "
            "Student-t tensors and on TE's own edge cases: an all-zero tensor (zeros, where "
            "torchao's two levels give NaN), a block whose scale rounds to 0 (its nonzero "
            "elements saturate to +-6) and an infinite element (S_enc = 1)."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Each step is one IEEE float32 operation (the oracle: the exact float64 result of "
            "two float32 operands, rounded to float32 by NumPy, which is the float32 "
            "operation's result since 53 >= 2 * 24 + 2) or a cast to e4m3 or fp4 (ml_dtypes "
            "in the oracle, the reference's encoder: one rounding to nearest even, "
            "formats.small_*). NaN into fp4 is a choice (TE's table writes +0, the "
            "reference the zero of the opposite sign), in a block whose scale is NaN anyway."
        ),
    ),
    Claim(
        id="mx.twins",
        statement=(
            "torch_impl.mx gives the reference's bits: the scaled values before the clamp "
            "(scaled_blocks, nvfp4_scaled), to_mx's scale and element codes (NaN blocks "
            "included) for every element format, scale mode, rounding and variant (the "
            "specification and torchao's), from_mx's float32 "
            "values, to_nvfp4's codes (one and two levels) and from_nvfp4's values, NaN as a "
            "class."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Integer arithmetic on the same float32 words for the scales; for the elements "
            "torch's float8 cast or exact float64 frexp / ldexp / round (half to even) and "
            "floor(q + 1/2) (half away) into the code W, against the reference's encoder: "
            "two computations of one correct rounding. A NaN is given the same canonical code "
            "in both; NaN values in a decoded NaN block are one class (their payloads are "
            "whatever the multiplication propagates)."
        ),
    ),
    Claim(
        id="mx.ocp",
        statement=(
            "reference.mx.to_mx's default (variant 'ocp', FLOOR scales) is OCP MX 1.0's "
            "conversion (section 6.3) computed apart from it, per block: X = 2^(floor(log2 "
            "amax) - e_max) clamped to 2^-127 .. 2^127 from math.frexp of the float64 amax, "
            "NaN for a block holding an inf or a NaN; P_i = V_i / X in float64, clamped to "
            "+-max_elem and cast by ml_dtypes to the element type; the value X P_i. Scale "
            "codes and decoded values agree, NaN as a class, for every element format on "
            "edge blocks (the smallest scale 2^-127 and +-inf among them) and under "
            "hypothesis."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Both divide by the same power of two (float32 in the reference, float64 here: "
            "exact either way, bar float32 quotients below 2^-149 that every element format "
            "rounds to a zero of the same sign) and round once to the element format "
            "(the reference's encoder, ml_dtypes' cast: the same rounding, formats.small_*); "
            "the scale is the float32 word's exponent field in the reference and frexp of a "
            "float64 here. torchao's variant fails this claim at the code 0 (a block at half "
            "its value) and at +-inf (a finite scale): docs/mx.md counts both."
        ),
    ),
    Claim(
        id="mx.microxcaling",
        statement=(
            "reference.mx.to_mx(variant='microxcaling') is microxcaling v1.1.0's default "
            "(Python) path, _quantize_mx with custom_cuda=False, computed apart in torch ops "
            "as the library calls them (torch.log2 in float32 for the shared and the private "
            "exponents, sign(A) floor(|A| + 0.5) in float32, the clamp, A * 2**e): decoded "
            "values agree, NaN as a class, for every element format on edge blocks, under "
            "hypothesis and on the notes' rows: an inf or NaN block is NaN, a zero block "
            "zeros, ties go away (0.25 -> 0.5, 2.5 -> 3, 5 -> 6 in fp4), FLT_MAX -> inf, a "
            "block max 2^20 (1 - 2^-24) under fp4 -> 2^20, -0 -> +0."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Both sides take the same float32 steps, each exact or rounded once: the "
            "division and multiplication by 2^e are exact, the float32 log2 is the "
            "correctly rounded one in the reference and torch's on CPU (the same at every "
            "input measured, mx.rceil_log2f, which holds floor as well as ceil), the "
            "private exponent cannot change a nearest rounding (reference/mx_variants.py), "
            "and |A| + 0.5 is the same float32 addition. On CUDA log2f was not measured."
        ),
    ),
    Claim(
        id="mx.microxcaling_cpp",
        statement=(
            "reference.mx.to_mx(variant='microxcaling_cpp') is microxcaling v1.1.0's C++ "
            "path (mx/cpp: mx_get_shared_scale, quantize_mx_elem, quantize_elemwise with "
            "rd_away, saturate_normals) transcribed apart on the float32 bits in Python "
            "scalars: decoded values agree bit for bit (NaN as a class) for every element "
            "format on edge blocks and under hypothesis, every zero +0."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "The transcription shifts the mantissa as the C++ does (a guard bit, +1 for ties "
            "away, then the shift); the reference rounds by exact float64 frexp / ldexp and "
            "floor(q / u + 1/2): two computations of one rounding, both of exact inputs "
            "(x / 2^e is exact in float32)."
        ),
    ),
    Claim(
        id="mx.transformer_engine",
        statement=(
            "reference.mx.to_mx(variant='transformer_engine') is Transformer Engine's MXFP8 "
            "quantize (d0067d0: quantize_mxfp8.cuh, ptx.cuh exp2f_rcp, ptx_arch_spec.cuh "
            "float_to_e8m0's software path, utils.cuh max_norm_rcp) computed apart in "
            "Python scalars with ml_dtypes casts: scale codes, element codes (NaN elements "
            "as a class) and decoded values agree for e4m3 and e5m2 on edge blocks, under "
            "hypothesis and on its rows: a NaN element leaves the block's other values, an "
            "inf one gives the code 254 and +-max_elem, a zero block zeros, a code-0 block "
            "multiplied by 2^127."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Each float32 operation of the kernel (amax * max_norm_rcp, x * R) is its "
            "float64 result rounded once by np.float32 (exact: 53 >= 2 * 24 + 2); "
            "float_to_e8m0 and exp2f_rcp are integer steps on the word, transcribed; the "
            "satfinite cast is ml_dtypes' nearest-even cast of the clamped value, the "
            "reference's encoder: the same rounding (formats.small_*)."
        ),
    ),
    Claim(
        id="mx.variants_table",
        statement=(
            "The table in docs/mx.md (generated: variants) is what the reference computes "
            "on the edge blocks: for each pair of variants and each class of block, how "
            "many blocks decode to different values (NaN as one value)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Counts are integers computed from the reference's codes on a fixed seed's edge "
            "blocks (parity/drivers/mx.py variant_disagreements) and compared with the "
            "committed table: a rule or an edge kind that moves a count shows."
        ),
    ),
    Claim(
        id="mx.rceil_log2f",
        statement=(
            "ceil(f32(log2 d)) with float64's log2 rounded once to float32 (the reference's "
            "rceil_log2f), and floor of it (microxcaling's variant), equal "
            "ceil(torch.log2(d)) and floor(torch.log2(d)) in float32 on CPU for every float32 d "
            "within 20,000 ulps of each power of two 2^-149 .. 2^127 and for 200,000 random "
            "words; the exact rceil (cuBLAS) differs from it just above powers of two."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Only whether log2 d rounds to the integer j or above it matters to the ceiling. "
            "log2(2^j (1 + f)) = j + f / ln 2, and the float32 threshold, half an ulp of j, is "
            "never within float64's rounding error of it (f / ln 2 is irrational against the "
            "dyadic threshold); torch's log2f is within an ulp and rounds these cases alike "
            "(measured: 10.8 million d near powers of two, no difference)."
        ),
    ),
    Claim(
        id="mx.clipping",
        statement=(
            "Per distribution (normal, Student-t with 3 dof, the compact GPT's linear-layer "
            "inputs), element format and scale mode, the reference and torch_impl count the "
            "same blocks clipping (scaled amax beyond the element max), and the same elements "
            "that ties-away rounding codes differently from nearest-even (on float32 inputs "
            "and on them rounded to bfloat16); the full table is docs/data/mx_counts.json."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Integer counts of bit-identical scaled values (mx.twins): the counts can only "
            "differ if a scaled amax or a code does. The table answers FLOOR against RCEIL: "
            "floor clips every block whose amax's significand exceeds the element max's "
            "(1.75 for e4m3: a fraction 1 - log2 1.75 = 0.19 of blocks were that significand "
            "log-uniform; docs/mx.md gives the measured rates); ceil and the exact rceil "
            "clip no finite block, rceil_log2f only those of the rounding trap above."
        ),
    ),
)

_TWINS = ("mx.twins",)
_same = Twin.same


def _constant(name: str) -> Twin:
    return _same("mx", name, *_TWINS)


MANIFEST = Manifest(
    topic="mx",
    modules=("reference.mx", "torch_impl.mx", "reference.mx_variants", "torch_impl.mx_variants"),
    rows=(
        *map(_constant, ("ELEMENT_FORMATS", "SCALE_MODES", "ROUNDINGS", "VARIANTS",
                         "NVFP4_VARIANTS", "BLOCK_SIZE", "NVFP4_BLOCK_SIZE", "E8M0_BIAS",
                         "E8M0_NAN", "F32_TINY", "E4M3_TINY", "E4M3_MAX", "FP4_MAX", "F32_MAX",
                         "MXTensor", "NVFP4Tensor")),
        _same("mx", "scale_codes", *_TWINS, "mx.rceil_log2f"),
        _same("mx", "scaled_blocks", *_TWINS),
        _same("mx", "round_elements", *_TWINS, "mx.clipping"),
        _same("mx", "to_mx", *_TWINS, "mx.ocp", "mx.torchao", "mx.microxcaling",
              "mx.microxcaling_cpp", "mx.transformer_engine", "mx.variants_table"),
        _same("mx", "from_mx", *_TWINS),
        _same("mx", "clipped_blocks", "mx.clipping"),
        _same("mx", "per_tensor_scale", *_TWINS, "mx.nvfp4_torchao"),
        _same("mx", "global_scales", *_TWINS, "mx.nvfp4_te"),
        _same("mx", "nvfp4_scaled", *_TWINS),
        _same("mx", "to_nvfp4", *_TWINS, "mx.nvfp4_te", "mx.nvfp4_torchao"),
        _same("mx", "from_nvfp4", *_TWINS, "mx.nvfp4_te"),
        _same("mx", "pack_fp4", "mx.torchao"),
        _same("mx", "unpack_fp4", "mx.torchao"),
        _same("mx_variants", "block_amax", "mx.twins", "mx.transformer_engine"),
        _same("mx_variants", "log2_floor_f32", "mx.twins", "mx.microxcaling",
              "mx.rceil_log2f"),
        _same("mx_variants", "te_quotient", "mx.twins", "mx.transformer_engine"),
        _same("mx_variants", "te_multiplier", "mx.twins", "mx.transformer_engine"),
        _same("mx_variants", "torchao_scaled", "mx.twins", "mx.torchao"),
        _same("mx_variants", "round_microxcaling", "mx.twins", "mx.microxcaling"),
        _same("mx_variants", "unsigned_zeros", "mx.twins", "mx.microxcaling_cpp"),
    ),
    headline="parity/test_mx.py::"
             "test_one_tensor_to_mxfp8_and_back_gives_the_same_bits_in_both_trees",
)
