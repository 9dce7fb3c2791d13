"""The formats claims (the kinds and the registry: parity/tolerances.py)."""

from __future__ import annotations

from parity.claims import Claim, Helper, Manifest, Twin
from parity.claims.formats_small import SMALL_CLAIMS, SMALL_ROWS

# One tuple per topic, concatenated below; a topic edits only its own tuple.
CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="formats.ranges",
        statement=(
            "Every range property of every named format (bits, eps, max, tiny, smallest "
            "subnormal, max/min exponent) is equal in reference.formats, torch.finfo and "
            "ml_dtypes.finfo."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The properties are exact dyadic numbers derived from (exponent bits, mantissa bits, "
            "convention); any difference would be an error, not rounding."
        ),
    ),
    Claim(
        id="formats.decode",
        statement=(
            "Every bit pattern of every 8- and 16-bit format decodes to the same value in the "
            "reference, in torch (.view then .to(float32)) and in ml_dtypes."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Decoding is exact (every format value is a float32); NaN payloads are not preserved "
            "alike by the three libraries, so NaNs compare as a class."
        ),
    ),
    Claim(
        id="formats.encode_f32",
        statement=(
            "Encoding float32 inputs with round-to-nearest-even is bit-identical to torch's "
            "native cast and to ml_dtypes; every NaN input gives a NaN. The overflow policy is "
            "each library's own: for float8_e4m3fn torch >= 2.13 saturates to +-448 (+-inf "
            "included) and torch 2.6-2.12 and ml_dtypes give NaN (measured on 2.6.0, 2.11.0, "
            "2.12.0, 2.12.1, 2.13.0: NOTE [ float8_e4m3fn overflow ]); the reference is run "
            "with the installed torch's policy and with 'nan' against ml_dtypes."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "One correctly rounded operation has one right answer; NaN sign and payload differ "
            "between libraries and even between torch code paths (a bf16 NaN is 0xFFFF from "
            "Tensor.to on a 1-d CPU tensor, 0x7FC0 from a 0-d one), so NaNs compare as a class."
        ),
        library=("torch", "ml_dtypes"),
    ),
    Claim(
        id="formats.encode_f64_correct",
        statement=(
            "Encoding float64 inputs (via=None) is correctly rounded: equal to rounding the exact "
            "rational value with fractions.Fraction, and equal to the torch twin's round-to-odd "
            "construction."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Correct rounding is unique. The torch twin gets it from native casts by rounding to "
            "odd in float32 first (float32 keeps >= 2 more bits than every target; Boldo and "
            "Melquiond 2008), an independent construction."
        ),
    ),
    Claim(
        id="formats.encode_f64_via_f32",
        statement=(
            "Encoding float64 inputs with via='float32' is bit-identical to torch's native "
            "float64 -> low-precision cast, which rounds through float32 (double rounding)."
        ),
        kind="nan_class",
        bound=0,
        reason="Both round twice at the same two precisions; each rounding is exact RNE.",
    ),
    Claim(
        id="formats.toward_zero",
        statement=(
            "Rounding toward zero is bit-identical between the reference (truncation of the "
            "integer significand) and the torch twin (native cast, then one step toward zero "
            "where the cast rounded away)."
        ),
        kind="nan_class",
        bound=0,
        reason="Truncation has one right answer; NaNs compare as a class.",
    ),
    Claim(
        id="formats.stochastic_bits",
        statement=(
            "Given the same 32-bit random words and the same overflow policy, stochastic "
            "rounding of float32 and float64 inputs is bit-identical in the reference and the "
            "torch twin. (The default policy follows each side's DEFAULT_OVERFLOW, which for "
            "float8_e4m3fn depends on the torch version: NOTE [ float8_e4m3fn overflow ].)"
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Both round up exactly when the random word is below the top 32 dropped bits; integer "
            "comparisons have no rounding."
        ),
    ),
    Claim(
        id="formats.stochastic_unbiased",
        statement=(
            "For every finite input below max plus one spacing, in both trees, the number of "
            "32-bit words that make stochastic rounding round up equals floor(2^32 p), p the "
            "exact fraction of a spacing that x lies above its toward-zero neighbour "
            "(fractions.Fraction). So P(up) = p and E[q(x)] = x exactly whenever at most 32 bits "
            "are dropped (every float32 input with a normal result), and p truncated to 32 bits "
            "otherwise. The count is found by bisection over the words and confirmed at random "
            "words (observed: inputs whose count differs, or is not confirmed)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Counting words is integer arithmetic, so the probability is checked exactly, per "
            "input, on ties, near ties, subnormals and the overflow edge of every format. It "
            "replaces a fixed-seed test of the mean of 20000 roundings at z = 5, which any bias "
            "below about 1.8% of a spacing (5 * 0.5 / sqrt(20000)) passed."
        ),
    ),
    Claim(
        id="formats.contract",
        statement=(
            "Where the trees share a name (encode, quantize, decode), they refuse the same bad "
            "inputs with the same, declared error class (unknown formats, modes and policies, "
            "wrong input dtypes, random words of the wrong type, shape or range, out-of-range "
            "codes, unsupported output dtypes) and return the declared shape (the input's) and "
            "dtype for good 0-d, 1-d and n-d inputs."
        ),
        kind="bits",
        bound=0,
        reason=(
            "A contract is exact: a case either gives the declared outcome on both sides or it "
            "does not (observed: the number of cases where either side differs from it)."
        ),
    ),
    Claim(
        id="formats.sweep",
        statement=(
            "Over all 2^32 float32 inputs (slow) or a sample, the reference, torch and ml_dtypes "
            "encodings agree except where the declared overflow/NaN policies differ (the "
            "reference is run with each library's policy, float8_e4m3fn's torch policy by "
            "version: NOTE [ float8_e4m3fn overflow ])."
        ),
        kind="nan_class",
        bound=0,
        reason="Exhaustive form of formats.encode_f32.",
    ),
    *SMALL_CLAIMS,
)

_ENCODE = ("formats.encode_f32", "formats.encode_f64_correct", "formats.encode_f64_via_f32",
           "formats.toward_zero", "formats.stochastic_bits", "formats.stochastic_unbiased",
           "formats.contract", "formats.sweep")

MANIFEST = Manifest(
    topic="formats",
    modules=("torch_impl.format_spec", "reference.formats", "torch_impl.formats",
             "reference.small_formats", "torch_impl.small_formats"),
    rows=(
        Twin("SMALL", reference="common.format_spec:EXTENDED",
             torch="torch_impl.format_spec:SMALL", claims=("formats.small_ranges",)),
        Twin("TorchFormat", reference="common.format_spec:FloatFormat",
             torch="torch_impl.format_spec:TorchFormat",
             claims=("formats.ranges", "formats.small_ranges", "formats.torch_finfo_e5m2fnuz")),
        Twin("FORMATS", reference="common.format_spec:FORMATS",
             torch="torch_impl.format_spec:FORMATS", claims=("formats.ranges",)),
        Twin("get_format", reference="common.format_spec:get_format",
             torch="torch_impl.format_spec:get_format", claims=("formats.ranges",)),
        Twin("DTYPES", torch="torch_impl.format_spec:DTYPES",
             why="torch's dtypes by format name: the reference's arrays are NumPy's and "
                 "ml_dtypes'"),
        Twin("ROUNDING_MODES", reference="reference.formats:ROUNDING_MODES",
             torch="torch_impl.formats:ROUNDING_MODES", claims=("formats.contract",)),
        Twin("OVERFLOW_POLICIES", reference="reference.formats:OVERFLOW_POLICIES",
             torch="torch_impl.formats:OVERFLOW_POLICIES", claims=("formats.contract",)),
        Twin("E4M3FN_SATURATES", torch="torch_impl.formats:E4M3FN_SATURATES",
             claims=("formats.sweep",),
             why="what this torch's float8_e4m3fn cast does past max (NOTE [ float8_e4m3fn "
                 "overflow ]): the reference takes either policy as an argument"),
        Twin("DEFAULT_OVERFLOW", reference="reference.formats:DEFAULT_OVERFLOW",
             torch="torch_impl.formats:DEFAULT_OVERFLOW", claims=("formats.encode_f32",)),
        Twin("encode", reference="reference.formats:encode", torch="torch_impl.formats:encode",
             claims=_ENCODE),
        Twin("encode_stepwise", reference="reference.formats:encode_stepwise",
             why="the statement of encode's rounding (decompose, round, pack), held bit-equal "
                 "to encode by tests/test_encode_fast.py: torch's cast hides its steps"),
        Twin("draw_random_words", reference="reference.formats:draw_random_words",
             torch="torch_impl.formats:draw_random_words", claims=("formats.stochastic_bits",)),
        Twin("decode", reference="reference.formats:decode", torch="torch_impl.formats:decode",
             claims=("formats.decode", "formats.contract")),
        Twin("quantize", reference="reference.formats:quantize",
             torch="torch_impl.formats:quantize", claims=("formats.toward_zero",
                                                          "formats.contract")),
        *SMALL_ROWS,
    ),
    helpers=(
        Helper("reference.encode_kernels",
               "kernel tuning: encode's block-by-block fast path, held bit-equal to "
               "encode_stepwise (tests/test_encode_fast.py); stays beside formats.py, which "
               "runs it"),
        Helper("reference.encode_pack",
               "kernel tuning: the fast path's pack step, convention by convention (split from "
               "encode_kernels.py along the step); stays beside it, which runs it"),
    ),
    headline="parity/test_formats.py::test_float16_rounding_matches_torch_cast_bitwise",
)
