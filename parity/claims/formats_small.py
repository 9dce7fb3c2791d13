"""The formats claims of the small formats (the fnuz float8s, E8M0, float6/float4, the
IEEE-like float8_e4m3/e3m4); parity/claims/formats.py adds them to its CLAIMS. Every
difference between libraries is a claim of its own, pinned to the versions measured:
torch 2.7 to 2.13 (whose casts to these formats are the same on 2.7.1, 2.8.0, 2.11.0, 2.12.0,
2.12.1 and 2.13.0; 2.6 has no float8_e8m0fnu) and ml_dtypes 0.7.0."""

from __future__ import annotations

from parity.claims import Claim, Twin

SMALL_CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="formats.small_ranges",
        statement=(
            "Every range property of float8_e4m3fnuz, float8_e5m2fnuz, float8_e4m3b11fnuz, "
            "float8_e8m0fnu, float6_e2m3fn, float6_e3m2fn, float4_e2m1fn, float8_e4m3 and "
            "float8_e3m4 derived from the bits (bits, eps, max, tiny, smallest subnormal, "
            "max/min exponent) equals ml_dtypes 0.7's finfo, and torch 2.13's finfo for "
            "float8_e4m3fnuz and float8_e8m0fnu; so do the code counts (finite, NaN) counted "
            "over ml_dtypes' decoding of every code."
        ),
        kind="bits",
        bound=0,
        reason="Exact dyadic numbers and integers derived from the layout; no rounding.",
        library=("torch", "ml_dtypes"),
    ),
    Claim(
        id="formats.torch_finfo_e5m2fnuz",
        statement=(
            "torch's finfo(float8_e5m2fnuz).eps is 0.125 (2^-3, float8_e4m3fnuz's; 2.6.0 to "
            "2.13.0 alike), where "
            "the format's 2 mantissa bits give 2^-2 = 0.25, as ml_dtypes 0.7's finfo and the "
            "spacing of torch's own decoded values at 1 (1.25 - 1) say; every other torch.finfo "
            "field of it is right."
        ),
        kind="bits",
        bound=0,
        reason="A declared library difference, checked exactly so that a fix in torch shows.",
        library=("torch",),
    ),
    Claim(
        id="formats.small_decode",
        statement=(
            "Every bit pattern of the nine small formats decodes to the same value in the "
            "reference and in ml_dtypes 0.7 (and, for float8_e4m3fnuz, e5m2fnuz, e8m0fnu, in "
            "torch 2.13 by .view): fnuz formats' one NaN is 0x80, E8M0's 0xFF, float6/float4 "
            "have no NaN and no infinity."
        ),
        kind="nan_class",
        bound=0,
        reason="Decoding is exact; NaN payloads are not compared.",
        library=("torch", "ml_dtypes"),
    ),
    Claim(
        id="formats.small_encode",
        statement=(
            "Encoding float32 with round to nearest is bit-identical in the reference, ml_dtypes "
            "0.7 and (where it casts) torch 2.13, every NaN input giving a NaN where the format "
            "has one. Both libraries, measured: fnuz overflow and +-inf give the NaN 0x80 and "
            "-0 gives +0; E8M0 overflow (from 1.5 * 2^127) and inf give 0xFF, and ties round "
            "up (1.5 -> 2, 3 -> 4: NOTE [ E8M0 ties ]); float6/float4 and ml_dtypes: overflow "
            "and +-inf saturate to +-max; float8_e4m3/e3m4 overflow to +-inf."
        ),
        kind="nan_class",
        bound=0,
        reason="One correctly rounded operation has one right answer; NaNs compare as a class.",
        library=("torch", "ml_dtypes"),
    ),
    Claim(
        id="formats.small_nan",
        statement=(
            "ml_dtypes 0.7 casts a NaN to float6_e2m3fn, float6_e3m2fn and float4_e2m1fn as a "
            "zero whose sign bit is the NaN's inverted (NumPy's nan, 0x7FC00000, gives -0.0; "
            "0xFFC00000 gives +0.0); the reference does the same (NOTE [ NaN to a finite "
            "format ]); torch 2.13 has no cast to these formats."
        ),
        kind="bits",
        bound=0,
        reason="Compared as codes: a sign is a bit, and a zero's sign is the whole difference.",
        library=("ml_dtypes",),
    ),
    Claim(
        id="formats.e8m0_torch",
        statement=(
            "torch's float8_e8m0fnu cast (2.7 to 2.13, the same bits on every version "
            "measured) differs from the reference in two places, measured on every float32 "
            "pattern below 2^24 of each sign and on sampled sweeps: a negative x gives the "
            "code of |x| (-4 -> 4) where the reference (and ml_dtypes 0.7) gives NaN; and |x| "
            "strictly between 2^-127 and 1.5 * 2^-127 (float32 subnormals nearer 2^-127) "
            "gives 2^-126 where the reference gives 2^-127. +-0 gives 2^-127 in both (NOTE "
            "[ E8M0 at zero ]). Everywhere else the two agree bit for bit."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "The difference is stated as a function of the reference's codes "
            "(parity/sweep_small.py torch_e8m0_codes) and checked exactly on every input."
        ),
        torch_since=(2, 7),
        library=("torch", "ml_dtypes"),
    ),
    Claim(
        id="formats.e8m0_ml_dtypes",
        statement=(
            "ml_dtypes 0.7's float8_e8m0fnu cast differs from the reference at +-0 only: NaN "
            "there, where the reference gives 2^-127 (code 0), the member nearest every x "
            "below 2^-127 and the code MX's scale rule gives an all-zero block (NOTE [ E8M0 "
            "at zero ]); on the edge inputs and every float32 pattern swept, no other input "
            "differs."
        ),
        kind="bits",
        bound=0,
        reason=(
            "A count of inputs on which the two casts differ outside +-0 (the stated "
            "difference): both round |x| to the nearest power of two with ties up, so any "
            "other difference would be a defect of one of them."
        ),
        library=("ml_dtypes",),
    ),
    Claim(
        id="formats.small_rounding",
        statement=(
            "Rounding toward zero and stochastic rounding (given the words) to the nine small "
            "formats, float32 and float64 input, equal an oracle built from ml_dtypes' decoded "
            "code table and exact rationals: toward zero is the largest member at or below |x| "
            "(max beyond it; E8M0's smallest value below it), and stochastic rounds up exactly "
            "when the word is below floor(2^32 p), p the exact fraction of the gap x lies above "
            "that member."
        ),
        kind="nan_class",
        bound=0,
        reason="Both sides are exact; the oracle shares no code with the reference's rounding.",
    ),
    Claim(
        id="formats.small_torch_twin",
        statement=(
            "torch_impl.formats encodes the nine small formats exactly as the reference does, "
            "code for code, on every edge class (members, ties and 1-2 float32 ulps either "
            "side, the overflow boundary, subnormals, +-0, +-inf, NaNs, random patterns; "
            "float32 and float64 input; nearest_even, toward_zero and stochastic with random "
            "words and the words either side of each threshold; every overflow policy the "
            "format allows; subnormals kept or flushed), and decodes every code to the same "
            "value. Where the twin rounds to nearest by torch's float8_e8m0fnu cast, the "
            "reference is held to torch's declared difference (formats.e8m0_torch)."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Codes are integers, compared exactly; decoded values compare bit for bit, NaNs "
            "as one class (their payloads are not the formats')."
        ),
    ),
    Claim(
        id="formats.small_sweep",
        statement=(
            "Over all 2^32 float32 inputs (slow) or a sample, the reference equals ml_dtypes "
            "0.7 on the nine small formats, and the torch twin (torch_impl.formats: torch "
            "2.13's own cast for float8_e4m3fnuz and e5m2fnuz, its cast to a sibling format "
            "for four of the six formats torch lacks, exact torch ops for the other two) on "
            "all nine, float8_e8m0fnu (torch's cast) once "
            "formats.e8m0_torch's declared difference is applied."
        ),
        kind="nan_class",
        bound=0,
        reason="Exhaustive form of formats.small_encode.",
        library=("torch", "ml_dtypes"),
    ),
)

# The small formats' rows of the formats manifest (parity/claims/formats.py). The reference
# rounds all nine on integers in reference/formats.py and packs them here; torch_impl rounds
# by a cast where torch has one (or a sibling's), by exact ops elsewhere.
SMALL_ROWS: tuple[Twin, ...] = (
    Twin("NATIVE", torch="torch_impl.small_formats:NATIVE", claims=("formats.small_encode",),
         why="which of the nine torch casts to: the reference rounds every one itself"),
    Twin("encode_native", reference="reference.formats:encode",
         torch="torch_impl.small_formats:encode_native",
         claims=("formats.small_encode", "formats.e8m0_torch")),
    Twin("SIBLING", torch="torch_impl.small_formats:SIBLING",
         why="the formats torch rounds by a sibling's cast (NOTE [ A sibling's cast ])"),
    Twin("sibling_applies", torch="torch_impl.small_formats:sibling_applies",
         why="whether a sibling's cast rounds this format: the reference has one path"),
    Twin("encode_sibling", reference="reference.formats:encode",
         torch="torch_impl.small_formats:encode_sibling",
         claims=("formats.small_torch_twin",)),
    Twin("encode_ops", reference="reference.formats:encode_stepwise",
         torch="torch_impl.small_formats:encode_ops",
         claims=("formats.small_rounding", "formats.small_torch_twin")),
    Twin("nearest_float32", reference="reference.encode_kernels:round_nearest_even",
         torch="torch_impl.small_formats:nearest_float32",
         claims=("formats.small_torch_twin", "formats.small_sweep")),
    Twin("pack_carried", reference="reference.encode_pack:pack",
         torch="torch_impl.small_formats:pack_carried", claims=("formats.small_torch_twin",)),
    Twin("pack", reference="reference.small_formats:pack",
         torch="torch_impl.small_formats:pack",
         claims=("formats.small_torch_twin", "formats.small_nan")),
    Twin("encode_unsigned", reference="reference.small_formats:encode_unsigned",
         torch="torch_impl.small_formats:encode_ops",
         claims=("formats.small_rounding", "formats.small_torch_twin",
                 "formats.e8m0_ml_dtypes")),
    Twin("decode_values", reference="reference.small_formats:decode_values",
         torch="torch_impl.small_formats:decode_values",
         claims=("formats.small_decode", "formats.small_torch_twin")),
)
