"""The exact oracles the number formats are checked against, and which library has which format.

Everything here is computed with Python's exact arithmetic (fractions.Fraction, integers,
math.ldexp of integers) from a format's bit widths alone: never with reference.formats'
rounding, which is what these oracles judge. A format is read only for its
(exponent_bits, mantissa_bits, convention), plain data; every limit below is re-derived.

- The names: ALL_FORMATS (every named format), STORAGE_FORMATS (those with a torch dtype and
  an ml_dtypes/NumPy type: the sweep's formats), NARROW (those whose ties float32 can hold),
  ML_DTYPES (the ml_dtypes/NumPy type of each storage format).
- The range fields (RANGE_FIELDS) and how ml_dtypes.finfo names each (`ml_dtypes_ranges`).
- Rounding: `round_exact` rounds a rational to a format (nearest-even or toward zero);
  `member_value` is the value of a code; `position` is |x| in units of the format's spacing.
- Stochastic rounding: `round_up_fraction` is the exact probability an unbiased rounding
  rounds x up; `words_rounding_up` counts the 32-bit random words that should round x up.
- Distances: `member_ranks` numbers every value of a small format in order (ulp_distance's
  oracle).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

# NumPy first: imported from Python, a missing or broken NumPy is one ImportError; imported
# by ml_dtypes' C extension, it prints a traceback of its own before that
import numpy as np

# isort: split
import ml_dtypes

ALL_FORMATS: tuple[str, ...] = (
    "float32", "tf32", "float16", "bfloat16", "float8_e5m2", "float8_e4m3fn")
# A torch dtype and an ml_dtypes (or NumPy) type: decoded, cast and swept in three libraries.
STORAGE_FORMATS: tuple[str, ...] = ("float16", "bfloat16", "float8_e5m2", "float8_e4m3fn")
# float32's own ties need 25 bits: only the narrower formats have float32-representable ties.
NARROW: tuple[str, ...] = tuple(n for n in ALL_FORMATS if n != "float32")
# The small formats beyond the classic five (common/format_spec.py EXTENDED): ml_dtypes >= 0.5
# has every one; torch 2.13 casts to three (TORCH_CASTS; its float4_e2m1fn_x2 is two packed
# codes with no cast: copy_kernel is not implemented for it). Swept three- or two-way.
SMALL_FORMATS: tuple[str, ...] = (
    "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e8m0fnu",
    "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn", "float8_e4m3", "float8_e3m4")
TORCH_CASTS: tuple[str, ...] = ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
SWEEP_FORMATS: tuple[str, ...] = (*STORAGE_FORMATS, *SMALL_FORMATS)
ML_DTYPES: dict[str, np.dtype] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    **{name: np.dtype(getattr(ml_dtypes, name)) for name in SMALL_FORMATS},
}

# Every range property, by the reference's and torch_impl's names. ml_dtypes.finfo names them
# as numpy.finfo does; unit_roundoff it lacks (it is eps / 2 there).
RANGE_FIELDS: tuple[str, ...] = (
    "bits", "exponent_bits", "mantissa_bits", "eps", "unit_roundoff", "max", "tiny",
    "smallest_subnormal", "min_exponent", "max_exponent")
ML_FINFO_NAMES: dict[str, str] = {
    "bits": "bits", "exponent_bits": "nexp", "mantissa_bits": "nmant", "eps": "eps",
    "max": "max", "tiny": "smallest_normal", "smallest_subnormal": "smallest_subnormal",
    "min_exponent": "minexp", "max_exponent": "maxexp"}


def ml_dtypes_ranges(name: str) -> dict[str, float]:
    """Every RANGE_FIELDS value of a storage format as ml_dtypes.finfo gives it."""
    fi = ml_dtypes.finfo(ML_DTYPES[name])
    ranges = {f: float(getattr(fi, ML_FINFO_NAMES[f])) for f in ML_FINFO_NAMES}
    ranges["unit_roundoff"] = float(fi.eps) / 2
    return ranges


class BitWidths(Protocol):
    """What the oracles read of a format: its bit widths and convention (plain data)."""

    @property
    def exponent_bits(self) -> int: ...
    @property
    def mantissa_bits(self) -> int: ...
    @property
    def convention(self) -> str: ...


@dataclass(frozen=True)
class Spec:
    """A format's limits, re-derived from its bit widths with exact integers."""

    e: int
    m: int
    fn: bool  # finite: no infinities, only S.1...1.1...1 is NaN

    @classmethod
    def of(cls, fmt: BitWidths) -> Spec:
        return cls(fmt.exponent_bits, fmt.mantissa_bits, fmt.convention == "fn")

    @property
    def bias(self) -> int:
        return 2 ** (self.e - 1) - 1

    @property
    def emin(self) -> int:
        """The exponent of the smallest normal (and the spacing exponent + m of subnormals)."""
        return 1 - self.bias

    @property
    def max_code(self) -> int:
        """The largest finite magnitude code (ieee: exponent field top - 1; fn: 1...10)."""
        return 2 ** (self.e + self.m) - 2 if self.fn else ((2**self.e - 1) << self.m) - 1

    @property
    def max(self) -> Fraction:
        top_field = 2**self.e - 1 if self.fn else 2**self.e - 2
        top_fraction = 2**self.m - 2 if self.fn else 2**self.m - 1
        return Fraction(2**self.m + top_fraction) * Fraction(2) ** (
            top_field - self.bias - self.m)

    def spacing(self, a: Fraction) -> Fraction:
        """The distance between members in the binade of |a| (a > 0), or below tiny."""
        e = a.numerator.bit_length() - a.denominator.bit_length()
        e = e if Fraction(2) ** e <= a else e - 1  # 2^e <= a < 2^(e+1)
        return Fraction(2) ** (max(e, self.emin) - self.m)


def position(x: float, fmt: BitWidths) -> Fraction:
    """|x| in units of the format's spacing at x's binade: an integer exactly for members, a
    half-integer exactly for ties."""
    a = Fraction(abs(x))
    return a / Spec.of(fmt).spacing(a) if a else Fraction(0)


def member_value(fmt: BitWidths, magnitude_code: int) -> float:
    """The value of a non-negative code from the bit layout alone (exact; no specials)."""
    s = Spec.of(fmt)
    field, frac = magnitude_code >> s.m, magnitude_code & (2**s.m - 1)
    if field == 0:
        return math.ldexp(frac, s.emin - s.m)
    return math.ldexp(2**s.m + frac, field - s.bias - s.m)


def round_exact(x: float | Fraction, fmt: BitWidths, rounding: str = "nearest_even",
                overflow: str = "inf") -> float:
    """x (a float or an exact rational) rounded once to `fmt`, as a Python float.

    rounding: "nearest_even" or "toward_zero". overflow: what a result beyond max becomes,
    "inf", "saturate" (+-max) or "nan"; +-inf input follows it too. Zeros keep their sign.
    """
    if isinstance(x, float) and math.isnan(x):
        return math.nan
    negative = math.copysign(1.0, x) < 0 if isinstance(x, float) else x < 0
    sign = -1.0 if negative else 1.0
    if isinstance(x, float) and math.isinf(x):
        return sign * {"inf": math.inf, "saturate": float(Spec.of(fmt).max), "nan": math.nan}[
            overflow]
    a = abs(Fraction(x))
    if a == 0:
        return sign * 0.0
    s = Spec.of(fmt)
    spacing = s.spacing(a)
    kept, rest = divmod(a, spacing)
    if rounding == "nearest_even":
        if rest > spacing / 2 or (rest == spacing / 2 and kept % 2 == 1):
            kept += 1
    elif rounding != "toward_zero":
        raise ValueError(f"round_exact: rounding {rounding!r} is not nearest_even/toward_zero")
    value = kept * spacing
    if value > s.max:
        return sign * {"inf": math.inf, "saturate": float(s.max), "nan": math.nan}[overflow]
    return sign * float(value)


def round_up_fraction(x: float, fmt: BitWidths) -> Fraction:
    """p: the exact fraction of a spacing that finite x lies above its toward-zero neighbour
    (0 for members, 1/2 for ties): what an unbiased stochastic rounding rounds up with."""
    a = Fraction(abs(x))
    if a == 0:
        return Fraction(0)
    spacing = Spec.of(fmt).spacing(a)
    return (a % spacing) / spacing


def words_rounding_up(x: float, fmt: BitWidths) -> int:
    """How many of the 2^32 random words round finite x up (away from zero) in stochastic
    rounding: floor(2^32 p), p = round_up_fraction(x). The probability of rounding up is this
    count / 2^32: exactly p whenever 2^32 p is an integer (at most 32 dropped bits), p
    truncated to 32 bits otherwise."""
    return math.floor(round_up_fraction(x, fmt) * 2**32)


@functools.cache
def member_ranks(fmt: BitWidths) -> tuple[np.ndarray, np.ndarray]:
    """(values, ranks) of every finite member of a format of at most 16 bits (and +-inf for
    IEEE formats), both signs, in increasing order; equal values share a rank (+0 and -0).
    The number of nextafter steps between two members is the difference of their ranks."""
    s = Spec.of(fmt)
    if s.e + s.m > 15:
        raise ValueError("member_ranks enumerates formats of at most 16 bits")
    positive = [member_value(fmt, c) for c in range(s.max_code + 1)]
    if not s.fn:
        positive.append(math.inf)
    values = np.array(sorted({*positive, *(-v for v in positive)}))
    values.flags.writeable = False  # cached: shared by every caller
    return values, np.arange(values.size)
