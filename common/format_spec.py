"""A binary floating-point format's ranges, derived from its bit widths (reference/formats.py
states the layout and the rounding; this module the properties every range table lists).

    bias = 2^(e-1) - 1          min_exponent = 1 - bias      tiny = 2^min_exponent
    eps = 2^-m                  unit_roundoff = 2^-(m+1)     smallest_subnormal = tiny * eps
    emax = top - bias (fn), top - 1 - bias (ieee), top = 2^e - 1     max_exponent = emax + 1
    max = (2 - 2^-m) * 2^emax (ieee),  (2 - 2^(1-m)) * 2^emax (fn: 1.11...1 at the top is NaN)

Conventions beyond IEEE's (the names are ml_dtypes'; every field below follows from them):

    ieee      top exponent: +-inf (F = 0) and NaNs                   float8_e4m3, float8_e3m4
    fn        no inf; S.1...1.1...1 is NaN (one per sign)             float8_e4m3fn
    fnuz      no inf, no -0: the code 1.0...0.0...0 (0x80) is the one NaN; bias 2^(e-1)
              (one more than IEEE's) unless given           float8_e4m3fnuz, e5m2fnuz, e4m3b11fnuz
    finite    no inf, no NaN: every code is a number; overflow saturates
                                                   float6_e2m3fn, float6_e3m2fn, float4_e2m1fn
    unsigned  no sign bit, no mantissa, no zero, no subnormals: value 2^(E - bias),
              E = 2^e - 1 is the one NaN                           float8_e8m0fnu (MX scales)

For `unsigned`, min_exponent = -bias (E = 0 is the normal 2^-bias) and tiny =
smallest_subnormal.

Exponent conventions follow numpy.finfo / ml_dtypes.finfo: `min_exponent` is the exponent of
`tiny`, `2**max_exponent` the smallest power of two that is not finite. The torch twin
(torch_impl/format_spec.py) reads the same properties off torch.finfo.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

Convention = Literal["ieee", "fn", "fnuz", "finite", "unsigned"]
CONVENTIONS: tuple[str, ...] = ("ieee", "fn", "fnuz", "finite", "unsigned")


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: 1 sign bit, `exponent_bits`, `mantissa_bits`.

    `convention` "ieee": the top exponent holds infinities and NaNs. "fn" (finite, as in
    float8_e4m3fn): no infinities; only S.1...1.1...1 is NaN, so the top binade holds normals.
    Exponent conventions follow numpy.finfo / ml_dtypes.finfo: `min_exponent` = 1 - bias
    (the exponent of `tiny`), `max_exponent` = the smallest power of two that is not finite.
    The derived properties are computed once per instance (cached_property stores them in
    the instance's __dict__, which a frozen dataclass leaves writable; equality and hashing
    read the four fields only).
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    convention: Convention = "ieee"
    exponent_bias: int | None = None  # None: 2^(e-1) - 1, or 2^(e-1) for fnuz

    def __post_init__(self) -> None:
        if self.convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {', '.join(CONVENTIONS)}, "
                             f"got {self.convention!r}")
        if self.convention == "unsigned":
            if self.mantissa_bits != 0 or not 2 <= self.exponent_bits <= 10:
                raise ValueError(f"{self.name}: an unsigned format has mantissa_bits 0 and "
                                 f"2 <= exponent_bits <= 10, got e={self.exponent_bits}, "
                                 f"m={self.mantissa_bits}")
            return
        # float64 must hold every value exactly: e <= 11, m <= 52.
        if not (1 <= self.exponent_bits <= 11 and 1 <= self.mantissa_bits <= 52) or (
                self.exponent_bits < 2 and self.convention != "finite"):
            raise ValueError(
                f"{self.name}: need 2 <= exponent_bits <= 11 (1 for finite formats) and "
                f"1 <= mantissa_bits <= 52 "
                f"(values must be exact in float64), got e={self.exponent_bits}, "
                f"m={self.mantissa_bits}"
            )

    @cached_property
    def signed(self) -> bool:
        return self.convention != "unsigned"

    @cached_property
    def bits(self) -> int:
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @cached_property
    def bias(self) -> int:
        if self.exponent_bias is not None:
            return self.exponent_bias
        return 2 ** (self.exponent_bits - 1) - (0 if self.convention == "fnuz" else 1)

    @cached_property
    def emax(self) -> int:
        """The largest unbiased exponent of a finite value."""
        top = 2**self.exponent_bits - 1
        return (top - 1 if self.convention in ("ieee", "unsigned") else top) - self.bias

    @cached_property
    def max_exponent(self) -> int:
        return self.emax + 1

    @cached_property
    def min_exponent(self) -> int:
        return (0 if self.convention == "unsigned" else 1) - self.bias

    @cached_property
    def eps(self) -> float:
        """Spacing at 1: 2^-m."""
        return 2.0 ** -self.mantissa_bits

    @cached_property
    def unit_roundoff(self) -> float:
        """Largest relative error of round-to-nearest in the normal range: 2^-(m+1)."""
        return 2.0 ** -(self.mantissa_bits + 1)

    @cached_property
    def max(self) -> float:
        # ieee, fnuz, finite: significand 1.11...1; fn: 1.11...10 (1.11...1 at the top is NaN)
        top_fraction = 2**self.mantissa_bits - (2 if self.convention == "fn" else 1)
        significand = 2**self.mantissa_bits + top_fraction
        return float(significand * 2.0 ** (self.emax - self.mantissa_bits))

    @cached_property
    def tiny(self) -> float:
        """The smallest positive normal, 2^(1 - bias)."""
        return 2.0**self.min_exponent

    @cached_property
    def smallest_subnormal(self) -> float:
        """The smallest positive value (tiny itself where there are no subnormals)."""
        if self.convention == "unsigned":
            return self.tiny
        return 2.0 ** (self.min_exponent - self.mantissa_bits)

    @cached_property
    def max_code(self) -> int:
        """The magnitude bits (sign cleared) of `max`."""
        all_ones = 2 ** (self.exponent_bits + self.mantissa_bits) - 1
        if self.convention in ("fn", "unsigned"):
            return all_ones - 1
        if self.convention in ("fnuz", "finite"):
            return all_ones
        return ((2**self.exponent_bits - 1) << self.mantissa_bits) - 1

    @cached_property
    def inf_code(self) -> int | None:
        if self.convention != "ieee":
            return None
        return (2**self.exponent_bits - 1) << self.mantissa_bits

    @cached_property
    def nan_code(self) -> int | None:
        """The canonical quiet NaN's magnitude bits (fnuz: 0, the NaN is the sign bit alone,
        `nan_full_code`; finite formats have none)."""
        if self.convention in ("fn", "unsigned"):
            return 2 ** (self.exponent_bits + self.mantissa_bits) - 1
        if self.convention == "fnuz":
            return 0
        if self.convention == "finite":
            return None
        return ((2**self.exponent_bits - 1) << self.mantissa_bits) | (1 << (self.mantissa_bits - 1))

    @cached_property
    def has_negative_zero(self) -> bool:
        return self.convention in ("ieee", "fn", "finite")

    @cached_property
    def finite_count(self) -> int:
        """Bit patterns that encode finite values (+0 and -0 counted separately)."""
        if self.convention in ("fn", "unsigned", "fnuz"):
            return 2**self.bits - (2 if self.convention == "fn" else 1)
        if self.convention == "finite":
            return 2**self.bits
        return 2**self.bits - 2 ** (self.mantissa_bits + 1)

    @cached_property
    def nan_count(self) -> int:
        """Bit patterns that are NaN."""
        if self.convention == "ieee":
            return 2 ** (self.mantissa_bits + 1) - 2
        return {"fn": 2, "fnuz": 1, "unsigned": 1, "finite": 0}[self.convention]

    @cached_property
    def code_dtype(self) -> type[np.unsignedinteger]:
        """The smallest unsigned integer type that holds one code."""
        for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
            if np.dtype(dtype).itemsize * 8 >= self.bits:
                return dtype
        raise AssertionError("bits <= 64 by construction")

    def __str__(self) -> str:
        return (f"{self.name}: exponent {self.exponent_bits}, mantissa {self.mantissa_bits}, "
                f"bias {self.bias}, {self.convention}")


# The formats beyond the five classic ones: the fnuz float8s (AMD, Graphcore), the MX scale
# and element formats (OCP Microscaling 1.0), and the IEEE-like float8s of ml_dtypes.
EXTENDED: tuple[FloatFormat, ...] = (
    FloatFormat("float8_e4m3fnuz", 4, 3, "fnuz"),
    FloatFormat("float8_e5m2fnuz", 5, 2, "fnuz"),
    FloatFormat("float8_e4m3b11fnuz", 4, 3, "fnuz", exponent_bias=11),
    FloatFormat("float8_e8m0fnu", 8, 0, "unsigned"),
    FloatFormat("float6_e2m3fn", 2, 3, "finite"),
    FloatFormat("float6_e3m2fn", 3, 2, "finite"),
    FloatFormat("float4_e2m1fn", 2, 1, "finite"),
    FloatFormat("float8_e4m3", 4, 3),
    FloatFormat("float8_e3m4", 3, 4),
)


FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        FloatFormat("float32", 8, 23),
        FloatFormat("tf32", 8, 10),
        FloatFormat("float16", 5, 10),
        FloatFormat("bfloat16", 8, 7),
        FloatFormat("float8_e5m2", 5, 2),
        FloatFormat("float8_e4m3fn", 4, 3, "fn"),
        *EXTENDED,
    )
}
FLOAT64 = FloatFormat("float64", 11, 52)


def get_format(fmt: str | FloatFormat) -> FloatFormat:
    """A FloatFormat from itself or from its name in FORMATS (or "float64")."""
    if isinstance(fmt, FloatFormat):
        return fmt
    if isinstance(fmt, str) and fmt in FORMATS:
        return FORMATS[fmt]
    if fmt == "float64":
        return FLOAT64
    raise unknown_format(fmt)


def unknown_format(fmt: object) -> ValueError:
    """The one refusal, in both trees, of a format name neither knows (FORMATS is the
    declared range of a format argument; the reference also takes "float64", the oracle's
    precision, and any FloatFormat)."""
    return ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)} (and float64 in "
                      "the reference: the oracle's precision)")
