"""Packing and decoding for every convention, and the unsigned exponent-only format.

reference/formats.py rounds on the integer W; this module turns a rounded magnitude code
into a code of the format's convention (common/format_spec.py lists them), decodes the
specials, and rounds to float8_e8m0fnu, whose values are powers of two only.

    ieee, fn   overflow by policy; NaN is nan_code with the input's sign; -0 kept
    fnuz       the one NaN is the sign bit alone (0x80); a zero result is +0 whatever the
               sign (no -0); overflow by policy ("nan" or "saturate")
    finite     no NaN: overflow (+-inf included) saturates; a NaN input gives a zero of the
               opposite sign (NOTE [ NaN to a finite format ])
    unsigned   E8M0: |code| = floor(log2 x) + bias, plus one where the significand's dropped
               bits call for it; below 2^-bias every x >= 0, +-0 included, gives 2^-bias
               (NOTE [ E8M0 at zero ]); a negative x and NaN give the NaN (no sign)

NOTE [ NaN to a finite format ]: float6/float4 have no NaN, so what a NaN becomes is a
choice. ml_dtypes 0.7 gives a zero whose sign bit is the NaN's sign bit inverted (measured:
0x7FC00000, NumPy's nan, gives -0.0, 0xFFC00000 gives +0.0; claim formats.small_nan); torch
2.13 has no cast to these formats. The reference does the same, so that the three-way
sweep compares every input; a caller who needs NaN kept must keep it beside the codes.

NOTE [ E8M0 at zero ]: E8M0 has no zero and no sign (OCP MX 1.0: 2^-127 .. 2^127 and NaN).
Rounding to nearest sends every x below 2^-127 to 2^-127, the member nearest it, and 0 is
such an x: so +-0 gives 2^-127 (code 0), as 1e-300 does, and as MX's scale rule gives a
block whose amax is 0. A negative x is not below the range but outside it (no sign): NaN.
ml_dtypes 0.7 gives NaN for +-0 (claim formats.e8m0_ml_dtypes: its one difference); torch's
cast gives code 0 there too (its differences: formats.e8m0_torch). Until this was decided,
the reference followed ml_dtypes and was inconsistent at zero.

NOTE [ E8M0 ties ]: with no mantissa both neighbours of a tie, 2^k and 2^(k+1), have the
significand 1, so "to even" has no even side; nearest rounds ties up, as torch 2.13's cast
and ml_dtypes 0.7's do (measured: 1.5 -> 2, 3 -> 4, 6 -> 8 in both).
"""

from __future__ import annotations

import numpy as np

from common.format_spec import FloatFormat


def pack(kept: np.ndarray, sign: np.ndarray, nan: np.ndarray, fmt: FloatFormat,
         overflow: str, subnormals: bool) -> np.ndarray:
    """The code: |code| = kept, then the overflow policy, NaN, and the sign."""
    code = kept
    if not subnormals:  # a subnormal result (|code| below the smallest normal's) becomes +-0
        code = np.where(code < 2**fmt.mantissa_bits, 0, code)
    top = np.uint64(fmt.bits - 1)
    if fmt.convention == "fnuz":
        sign = np.where(code == 0, 0, sign).astype(np.uint64)  # no -0
        beyond = code > fmt.max_code
        nan_out = nan | (beyond if overflow == "nan" else False)
        code = np.where(beyond, fmt.max_code, code)
        code = np.where(nan_out, 0, code)
        sign = np.where(nan_out, 1, sign).astype(np.uint64)
        return ((sign << top) | code.astype(np.uint64)).astype(fmt.code_dtype)
    if fmt.convention == "finite":
        code = np.minimum(code, fmt.max_code)
        code = np.where(nan, 0, code)
        sign = np.where(nan, 1 - sign, sign).astype(np.uint64)  # NOTE [ NaN to a finite format ]
        return ((sign << top) | code.astype(np.uint64)).astype(fmt.code_dtype)
    beyond = {"inf": fmt.inf_code, "saturate": fmt.max_code, "nan": fmt.nan_code}[overflow]
    code = np.where(code > fmt.max_code, beyond, code)  # +-inf lands here too
    code = np.where(nan, fmt.nan_code, code)  # the quiet NaN, with the input's sign
    return ((sign << top) | code.astype(np.uint64)).astype(fmt.code_dtype)


def encode_unsigned(x: np.ndarray, fmt: FloatFormat, rounding: str, words: np.ndarray | None,
                    overflow: str) -> np.ndarray:
    """float64 x (or float32) rounded to an exponent-only unsigned format's codes."""
    with np.errstate(invalid="ignore"):  # a signalling NaN quiets: still a NaN
        xd = x.astype(np.float64)
        bad = ~(xd >= 0)  # NaN and negatives: no such value (NOTE [ E8M0 at zero ])
    safe = np.where(bad | np.isinf(xd) | (xd == 0), 1.0, xd)
    f, e = np.frexp(safe)  # safe = f * 2^e, 0.5 <= f < 1: floor(log2) = e - 1
    t = e.astype(np.int64) - 1
    frac = 2 * f - 1  # the significand's dropped part, in [0, 1): exact
    if rounding == "nearest_even":
        up = frac >= 0.5  # NOTE [ E8M0 ties ]
    elif rounding == "stochastic":
        # NOTE [ Stochastic rounding with 32-bit words ]: up when u < floor(2^32 frac)
        up = words < np.floor(np.ldexp(frac, 32)).astype(np.uint64)
    else:
        up = np.zeros(x.shape, bool)
    code = t + fmt.bias + up
    code = np.where((t + fmt.bias < 0) | (xd == 0), 0, code)  # below 2^-bias: the smallest
    beyond = (code > fmt.max_code) | np.isinf(xd)
    code = np.where(beyond, fmt.max_code if overflow == "saturate" else fmt.nan_code, code)
    code = np.where(bad, fmt.nan_code, code)
    return code.astype(fmt.code_dtype)


def decode_values(c: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """The float64 value of each uint64 code, specials included."""
    m = fmt.mantissa_bits
    if fmt.convention == "unsigned":
        value = np.ldexp(1.0, c.astype(np.int64) - fmt.bias)
        return np.where(c == fmt.nan_code, np.nan, value)
    negative = (c >> np.uint64(fmt.bits - 1)) == 1
    field = ((c >> np.uint64(m)) & np.uint64(2**fmt.exponent_bits - 1)).astype(np.int64)
    frac = (c & np.uint64(2**m - 1)).astype(np.int64)
    # value = M * 2^(max(E, 1) - bias - m); M < 2^53 and the power is in range, so ldexp is exact.
    big_m = np.where(field > 0, frac + 2**m, frac)
    with np.errstate(over="ignore"):
        value = np.ldexp(big_m.astype(np.float64), np.maximum(field, 1) - fmt.bias - m)
    magnitude = c & np.uint64(2 ** (fmt.bits - 1) - 1)
    if fmt.convention == "fnuz":
        value = np.where(c == 2 ** (fmt.bits - 1), np.nan, value)
    elif fmt.nan_code is not None:
        value = np.where(magnitude == fmt.nan_code, np.nan, value)
    if fmt.convention == "ieee":
        top = 2**fmt.exponent_bits - 1
        value = np.where((field == top) & (frac == 0), np.inf, value)
        value = np.where((field == top) & (frac != 0), np.nan, value)
    return np.where(negative, -value, value)
