"""The formats claims (the kinds and the registry: parity/tolerances.py)."""

from __future__ import annotations

from parity.claims import Claim

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
            "native cast (with torch's overflow policy) and to ml_dtypes (with overflow='nan' for "
            "float8_e4m3fn); every NaN input gives a NaN."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "One correctly rounded operation has one right answer; NaN sign and payload differ "
            "between libraries and even between torch code paths (a bf16 NaN is 0xFFFF from "
            "Tensor.to on a 1-d CPU tensor, 0x7FC0 from a 0-d one), so NaNs compare as a class."
        ),
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
            "Given the same 32-bit random words, stochastic rounding of float32 inputs is "
            "bit-identical in the reference and the torch twin."
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
            "Stochastic rounding is unbiased: the mean of n roundings of x lies within z * sigma "
            "/ sqrt(n) of x, sigma = sqrt(p(1-p)) * spacing, z = 5.0."
        ),
        kind="statistical",
        bound=5.8e-7,
        reason=(
            "Each rounding is lo + spacing * Bernoulli(p); by the CLT the standardized mean is "
            "~N(0,1) for n = 20000, and P(|Z| > 5) = 5.7e-7 (two-sided) per checked input."
        ),
    ),
    Claim(
        id="formats.sweep",
        statement=(
            "Over all 2^32 float32 inputs (slow) or a sample, the reference, torch and ml_dtypes "
            "encodings agree except where the declared overflow/NaN policies differ."
        ),
        kind="nan_class",
        bound=0,
        reason="Exhaustive form of formats.encode_f32.",
    ),
)
