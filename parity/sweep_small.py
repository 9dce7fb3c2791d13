"""The sweep's bookkeeping for the small formats (fnuz, finite, unsigned conventions and the
IEEE-like float8_e4m3/e3m4): which codes are NaN, what class each input is, and torch's
declared E8M0 behaviour. parity/sweep.py does the rest.

The classic formats are classed by the reference's non-saturating codes; these are classed
by the input itself, against bounds from the bit layout: `overflow` is every finite input
that rounds to nearest beyond max (at or past max + ulp/2 when max's code is odd, as it is
in every small format but float8_e8m0fnu, whose ties round up: NOTE [ E8M0 ties ]), and
`subnormal` every nonzero input below tiny (for E8M0, which has no subnormals, the inputs
that become 2^-127 from below).
"""

from __future__ import annotations

import functools

import numpy as np

import reference.formats as ref


def small_nan_codes(codes: np.ndarray, fmt: ref.FloatFormat) -> np.ndarray:
    """Where codes of a small format are NaN."""
    if fmt.convention == "fnuz":
        return codes == codes.dtype.type(2 ** (fmt.bits - 1))
    if fmt.convention == "unsigned":
        return codes == codes.dtype.type(fmt.nan_code)
    if fmt.convention == "finite":
        return np.zeros(codes.shape, bool)
    magnitude = codes & codes.dtype.type(2 ** (fmt.bits - 1) - 1)
    return magnitude > fmt.inf_code


def overflow_bound(fmt: ref.FloatFormat) -> float:
    """The smallest magnitude that rounds to nearest beyond max (the rounding's tie)."""
    if fmt.convention == "unsigned":
        return 1.5 * fmt.max
    return fmt.max + 2.0 ** (fmt.emax - fmt.mantissa_bits) / 2


def class_edges(fmt: ref.FloatFormat, dtype: type = np.float32) -> tuple[int, int, int]:
    """(tiny, overflow, inf) as magnitude bits of `dtype` (float32 or float64): |x| < tiny
    exactly when |x|'s bits are below the first, |x| >= overflow_bound exactly when they are
    at or above the second (the first `dtype` value at or above the bound; +inf's bits where
    no finite one is), and the third is +inf's."""
    uint = np.uint32 if dtype == np.float32 else np.uint64
    tiny = dtype(fmt.tiny)
    assert float(tiny) == fmt.tiny, fmt  # a power of two inside float32's range
    bound = overflow_bound(fmt)
    with np.errstate(over="ignore"):
        first = dtype(bound)
    if float(first) < bound:  # (compared in float64)
        first = np.nextafter(first, dtype(np.inf))
    return int(tiny.view(uint)), int(first.view(uint)), int(dtype(np.inf).view(uint))


@functools.cache
def _float32_edges(fmt: ref.FloatFormat) -> tuple[int, int, int]:
    """class_edges for float32, once per format (a sweep asks for them in every chunk)."""
    return class_edges(fmt, np.float32)


def small_classes(x: np.ndarray, nan_in: np.ndarray, fmt: ref.FloatFormat) -> dict[str, int]:
    """Inputs by class, from the float32 (or float64) inputs' bits: with the sign cleared
    they are in the order of |x| (NaNs above +inf's), so every class is an interval of them,
    bounded by class_edges, and one count of the values below each edge gives them all (five
    integer passes, where comparing float64 values took a dozen)."""
    uint = np.uint32 if x.dtype == np.float32 else np.uint64
    magnitude = x.view(uint) & uint(np.iinfo(uint).max >> 1)
    tiny, bound, inf = (uint(e) for e in class_edges(fmt, x.dtype.type))

    def below(edge: np.unsignedinteger) -> int:
        return int(np.count_nonzero(magnitude < edge))

    zero = x.size - int(np.count_nonzero(magnitude))
    below_tiny, below_bound, below_inf = below(tiny), below(bound), below(inf)
    nan = int(np.count_nonzero(nan_in))
    return {"normal": below_bound - below_tiny, "subnormal": below_tiny - zero, "zero": zero,
            "overflow": below_inf - below_bound, "inf": x.size - below_inf - nan, "nan": nan}


def range_classes(start: int, n: int, fmt: ref.FloatFormat) -> dict[str, int]:
    """small_classes of the n consecutive float32 bit patterns from `start` (an exhaustive
    sweep's chunk), with no pass over them: every class is an interval of the magnitude's
    bits (small_classes), and the patterns below 2^31 and those above (the same magnitudes,
    negative) are each an interval of magnitudes, so every count is an overlap of two
    intervals."""
    if not 0 <= start <= start + n <= 2**32:
        raise ValueError(f"range_classes: [{start}, {start + n}) is not within [0, 2^32)")
    tiny, bound, inf = _float32_edges(fmt)
    spans = [(lo & 0x7FFFFFFF, hi - (lo & ~0x7FFFFFFF)) for lo, hi in (
        (start, min(start + n, 2**31)), (max(start, 2**31), start + n)) if lo < hi]

    def below(edge: int) -> int:  # patterns whose magnitude is below `edge`
        return sum(max(0, min(hi, edge) - lo) for lo, hi in spans)

    zero, below_tiny, below_bound, below_inf = below(1), below(tiny), below(bound), below(inf)
    nan = n - below(inf + 1)
    return {"normal": below_bound - below_tiny, "subnormal": below_tiny - zero, "zero": zero,
            "overflow": below_inf - below_bound, "inf": below(inf + 1) - below_inf, "nan": nan}


def torch_e8m0_codes(x: np.ndarray, fmt: ref.FloatFormat, overflow: str | None = None,
                     ours: np.ndarray | None = None) -> np.ndarray:
    """What torch 2.13's float8_e8m0fnu cast gives, stated through the reference (claim
    formats.e8m0_torch): the code of |x|, where ml_dtypes 0.7 and the reference give the NaN
    for every negative; and 2^-126's (code 1) for |x| strictly between 2^-127 and
    1.5 * 2^-127, float32 subnormals that are nearer 2^-127 (torch rounds a subnormal's
    fraction bits as if its hidden bit were 0, so anything above the guard bit's half rounds
    up); +-0 gives 2^-127 in the reference too (NOTE [ E8M0 at zero ]). `overflow`: the
    reference's policy ("saturate" turns the cast's NaN code for an overflow or +-inf into
    max). `ours`: the reference's codes of x where no x has its sign bit set (a sweep's chunk
    below 2^31), which are |x|'s: they are used, where encoding |x| again was E8M0's sweep's
    costliest pass."""
    magnitude = np.abs(x)
    codes = ours if ours is not None else ref.encode(magnitude, fmt, overflow=overflow)
    low = (magnitude > np.float32(2.0**-127)) & (magnitude < np.float32(1.5 * 2.0**-127))
    return np.where(low, codes.dtype.type(1), codes)
