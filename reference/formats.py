"""Binary floating-point formats from their bits: ranges, rounding, encode and decode.

A format with e exponent bits and m mantissa (fraction) bits stores a value in 1 + e + m bits:

    float32        S EEEEEEEE MMMMMMMMMMMMMMMMMMMMMMM    e=8  m=23  bias=127
    tf32           S EEEEEEEE MMMMMMMMMM                 e=8  m=10  bias=127 (no storage dtype)
    bfloat16       S EEEEEEEE MMMMMMM                    e=8  m=7   bias=127
    float16        S EEEEE MMMMMMMMMM                    e=5  m=10  bias=15
    float8_e5m2    S EEEEE MM                            e=5  m=2   bias=15
    float8_e4m3fn  S EEEE MMM                            e=4  m=3   bias=7  fn: S.1111.111 is NaN

With bias b = 2^(e-1) - 1, a stored exponent field E and fraction field F mean

    E = 0                 (-1)^S * F / 2^m * 2^(1 - b)            zero and subnormals
    0 < E < top           (-1)^S * (1 + F / 2^m) * 2^(E - b)      normals
    E = top (ieee)        F = 0: +-inf, F != 0: NaN
    E = top (fn)          F = 2^m - 1: NaN, every other F: a normal as above

Every range property below is derived from (e, m, convention), never pasted.

Rounding works on the integers, the lesson of this module. A finite x is M * 2^q exactly
(M the integer significand with its hidden bit, q an integer). At x's binade the target's
spacing is 2^(t - m) with t = max(floor(log2|x|), 1 - b), so rounding drops the low
`shift = t - m - q` bits of M:

    kept = M >> shift,  rest = M mod 2^shift,  half = 2^(shift - 1)
    nearest_even:  kept += (rest > half) or (rest == half and kept is odd)
    toward_zero:   kept unchanged
    stochastic:    kept += (u < top 32 bits of rest), u a uniform random 32-bit word

Worked tie, float32 1 + 2^-8 (bits 0x3F808000) to bfloat16: M = 0x808000, shift = 16,
kept = 0x80 (even), rest = 0x8000 = half: a tie, kept is even, so the result is 1.0 (0x3F80).
One float32 ulp above, rest > half and the result is 1 + 2^-7 (0x3F81).

The encoding is monotone in |x|: |code| = ((t - (1 - b)) << m) + kept for normals and
subnormals alike, and a carry out of the significand (kept = 2^(m+1)) lands on the next
binade by itself. That is why rounding up is an integer +1 and why overflow is a comparison
of codes.

Double rounding: torch and ml_dtypes cast float64 to a low-precision format through float32.
Rounding twice can differ from rounding once: 1 + 2^-8 + 2^-40 rounds to float32 1 + 2^-8, a
tie that bfloat16 breaks to 1.0, while the correctly rounded bfloat16 is 1 + 2^-7 = 1.0078125.
`quantize` rounds float64 once by default; `via="float32"` reproduces the libraries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Convention = Literal["ieee", "fn"]
ROUNDING_MODES = ("nearest_even", "toward_zero", "stochastic")
OVERFLOW_POLICIES = ("inf", "saturate", "nan")


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: 1 sign bit, `exponent_bits`, `mantissa_bits`.

    `convention` "ieee": the top exponent holds infinities and NaNs. "fn" (finite, as in
    float8_e4m3fn): no infinities; only S.1...1.1...1 is NaN, so the top binade holds normals.
    Exponent conventions follow numpy.finfo / ml_dtypes.finfo: `min_exponent` = 1 - bias
    (the exponent of `tiny`), `max_exponent` = the smallest power of two that is not finite.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    convention: Convention = "ieee"

    def __post_init__(self) -> None:
        if self.convention not in ("ieee", "fn"):
            raise ValueError(f"convention must be 'ieee' or 'fn', got {self.convention!r}")
        # float64 must hold every value exactly: e <= 11, m <= 52.
        if not (2 <= self.exponent_bits <= 11 and 1 <= self.mantissa_bits <= 52):
            raise ValueError(
                f"{self.name}: need 2 <= exponent_bits <= 11 and 1 <= mantissa_bits <= 52 "
                f"(values must be exact in float64), got e={self.exponent_bits}, "
                f"m={self.mantissa_bits}"
            )
        if self.convention == "fn" and self.exponent_bits < 2:
            raise ValueError(f"{self.name}: an fn format needs at least 2 exponent bits")

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def emax(self) -> int:
        """The largest unbiased exponent of a finite value."""
        top = 2**self.exponent_bits - 1
        return (top if self.convention == "fn" else top - 1) - self.bias

    @property
    def max_exponent(self) -> int:
        return self.emax + 1

    @property
    def min_exponent(self) -> int:
        return 1 - self.bias

    @property
    def eps(self) -> float:
        """Spacing at 1: 2^-m."""
        return 2.0 ** -self.mantissa_bits

    @property
    def unit_roundoff(self) -> float:
        """Largest relative error of round-to-nearest in the normal range: 2^-(m+1)."""
        return 2.0 ** -(self.mantissa_bits + 1)

    @property
    def max(self) -> float:
        # ieee: significand 1.11...1; fn: 1.11...10, since 1.11...1 at the top is NaN.
        top_fraction = 2**self.mantissa_bits - (2 if self.convention == "fn" else 1)
        significand = 2**self.mantissa_bits + top_fraction
        return float(significand * 2.0 ** (self.emax - self.mantissa_bits))

    @property
    def tiny(self) -> float:
        """The smallest positive normal, 2^(1 - bias)."""
        return 2.0**self.min_exponent

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (self.min_exponent - self.mantissa_bits)

    @property
    def max_code(self) -> int:
        """The magnitude bits (sign cleared) of `max`."""
        if self.convention == "fn":
            return 2 ** (self.exponent_bits + self.mantissa_bits) - 2
        return ((2**self.exponent_bits - 1) << self.mantissa_bits) - 1

    @property
    def inf_code(self) -> int | None:
        if self.convention == "fn":
            return None
        return (2**self.exponent_bits - 1) << self.mantissa_bits

    @property
    def nan_code(self) -> int:
        """The canonical quiet NaN's magnitude bits."""
        if self.convention == "fn":
            return 2 ** (self.exponent_bits + self.mantissa_bits) - 1
        return ((2**self.exponent_bits - 1) << self.mantissa_bits) | (1 << (self.mantissa_bits - 1))

    @property
    def finite_count(self) -> int:
        """Bit patterns that encode finite values (+0 and -0 counted separately)."""
        if self.convention == "fn":
            return 2**self.bits - 2
        return 2**self.bits - 2 ** (self.mantissa_bits + 1)

    @property
    def code_dtype(self) -> type[np.unsignedinteger]:
        """The smallest unsigned integer type that holds one code."""
        for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
            if np.dtype(dtype).itemsize * 8 >= self.bits:
                return dtype
        raise AssertionError("bits <= 64 by construction")

    def __str__(self) -> str:
        return (f"{self.name}: exponent {self.exponent_bits}, mantissa {self.mantissa_bits}, "
                f"bias {self.bias}, {self.convention}")


FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        FloatFormat("float32", 8, 23),
        FloatFormat("tf32", 8, 10),
        FloatFormat("float16", 5, 10),
        FloatFormat("bfloat16", 8, 7),
        FloatFormat("float8_e5m2", 5, 2),
        FloatFormat("float8_e4m3fn", 4, 3, "fn"),
    )
}
FLOAT64 = FloatFormat("float64", 11, 52)

# What PyTorch's cast does on overflow (recent torch; see DEFAULT_OVERFLOW's note).
# NOTE [ float8_e4m3fn overflow ]: PyTorch >= 2.12 saturates float8_e4m3fn casts on CPU and
# CUDA, +-inf included (+-inf -> +-448; pytorch/pytorch#178817, merged 2026-04-17). PyTorch
# 2.6-2.11 and ml_dtypes give NaN for every value that rounds above 448 and for +-inf. The
# reference follows recent torch by default; overflow="nan" reproduces older torch and
# ml_dtypes. The torch twin picks its default from the installed torch's version.
DEFAULT_OVERFLOW: dict[str, str] = {"float8_e4m3fn": "saturate"}


def get_format(fmt: str | FloatFormat) -> FloatFormat:
    """A FloatFormat from itself or from its name in FORMATS."""
    if isinstance(fmt, FloatFormat):
        return fmt
    if fmt in FORMATS:
        return FORMATS[fmt]
    if fmt == "float64":
        return FLOAT64
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join([*FORMATS, 'float64'])}")


def _as_float_array(x: object) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise TypeError(f"expected floating-point input, got dtype {a.dtype}")
    return a


def encode(
    x: object,
    fmt: str | FloatFormat,
    *,
    rounding: str = "nearest_even",
    rng: np.random.Generator | None = None,
    random_bits: np.ndarray | None = None,
    overflow: str | None = None,
    subnormals: bool = True,
    via: str | None = None,
) -> np.ndarray:
    """Round float32/float64 `x` into `fmt` and return the codes (uint8/16/32/64, x's shape).

    See `quantize` for the arguments; this is the same rounding, stopping at the bits.
    """
    fmt = get_format(fmt)
    x = _as_float_array(x)
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"expected a float32 or float64 array, got dtype {x.dtype}")
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; accepted: {', '.join(ROUNDING_MODES)}")
    if overflow is None:
        # IEEE 754 7.4: rounding toward zero carries overflow to the largest finite value.
        default = DEFAULT_OVERFLOW.get(fmt.name, "inf" if fmt.inf_code is not None else "saturate")
        overflow = "saturate" if rounding == "toward_zero" else default
    if overflow not in OVERFLOW_POLICIES:
        raise ValueError(
            f"unknown overflow {overflow!r}; accepted: {', '.join(OVERFLOW_POLICIES)}")
    if overflow == "inf" and fmt.inf_code is None:
        raise ValueError(f"{fmt.name} has no infinity; use overflow='saturate' or 'nan'")
    if via is not None:
        if via != "float32" or x.dtype != np.float64:
            raise ValueError("via='float32' applies to float64 input only (and is the only via)")
        x = decode(encode(x, "float32"), "float32").astype(np.float32)

    if x.dtype == np.float32 and (fmt.mantissa_bits >= 23 or fmt.min_exponent < -126
                                  or fmt.max_exponent > 128):
        with np.errstate(invalid="ignore"):  # a signalling NaN is quieted: it stays a NaN
            x = x.astype(np.float64)  # a target as wide as float32 somewhere: use float64
    src = FORMATS["float32"] if x.dtype == np.float32 else FLOAT64
    # Unsigned arithmetic of the source's width throughout: uint32 for float32 input (half
    # the memory traffic of uint64), uint64 for float64. Every exponent below is a biased
    # source exponent, so nothing is negative.
    uint = np.uint32 if src.bits == 32 else np.uint64
    one = uint(1)
    word = np.ascontiguousarray(x).view(uint)
    magnitude = word & uint(2 ** (src.bits - 1) - 1)
    field = magnitude >> uint(src.mantissa_bits)

    # |x| = M * 2^q with q = max(E, 1) - bias - m_src: M is the fraction plus the hidden bit
    # of normals, i.e. the magnitude less (max(E, 1) - 1) binades' worth of exponent.
    e1 = np.maximum(field, one)
    big_m = magnitude - ((e1 - one) << uint(src.mantissa_bits))
    # The target binade t = max(floor(log2|x|), 1 - bias). (For subnormal inputs max(E, 1)
    # overstates log2|x|; harmless, since the target's subnormal binade is above theirs.)
    floor_t = uint(fmt.min_exponent + src.bias)
    t = np.maximum(e1, floor_t)
    # shift = t - m - q: the low bits of M that fall below the target's spacing.
    shift = (t - e1) + uint(src.mantissa_bits - fmt.mantissa_bits)
    down = np.minimum(shift, uint(src.bits - 1))  # M < 2^(m_src+1): dropping all is enough
    kept = big_m >> down
    if rounding == "nearest_even":
        # Round half to even in one pass: add half - 1, and 1 more when kept is odd.
        # (`some` is 0 only where nothing is dropped, possible only for as many mantissa bits.)
        some = np.minimum(down, one) if fmt.mantissa_bits >= src.mantissa_bits else one
        half = (one << down) >> one
        kept = (big_m + half - some + (kept & some)) >> down
    elif rounding == "stochastic":
        u = _random_words(x.shape, rng, random_bits)
        rest = (big_m - (kept << down)).astype(np.uint64)
        shift64 = shift.astype(np.int64)
        # NOTE [ Stochastic rounding with 32-bit words ]: round up when u is below the top 32
        # bits of `rest` as a fraction of the spacing: probability rest / 2^shift, exactly
        # unbiased when shift <= 32. With more dropped bits (results deep in the subnormals,
        # or float64 input) the probability is truncated to 32 bits, a bias below 2^-32 of
        # the spacing.
        top32 = np.where(
            shift64 <= 32,
            rest << np.clip(32 - shift64, 0, 63).astype(np.uint64),
            rest >> np.clip(shift64 - 32, 0, 63).astype(np.uint64),
        )
        kept = kept + (u < top32).astype(uint)

    # The monotone code: binades above the subnormal one, then the kept significand.
    # A carry out of the significand (kept == 2^(m+1)) lands in the next binade by itself.
    code = ((t - floor_t) << uint(fmt.mantissa_bits)) + kept
    if not subnormals:
        code = np.where(code < (one << uint(fmt.mantissa_bits)), uint(0), code)
    # Overflow (+-inf lands here too): every code above max becomes the policy's code. When
    # that code is max or the one right above it, this is a minimum (cheaper than a select).
    replacement = {"inf": fmt.inf_code, "saturate": fmt.max_code, "nan": fmt.nan_code}[overflow]
    if replacement <= fmt.max_code + 1:
        code = np.minimum(code, uint(replacement))
    else:
        code = np.where(code > uint(fmt.max_code), uint(replacement), code)
    # NaN stays NaN: the quiet NaN with the input's sign (payloads are not carried).
    np.copyto(code, uint(fmt.nan_code), where=magnitude > uint(src.inf_code))
    code |= (word >> uint(src.bits - 1)) << uint(fmt.bits - 1)
    return code.astype(fmt.code_dtype)


def _random_words(
    shape: tuple[int, ...], rng: np.random.Generator | None, random_bits: np.ndarray | None
) -> np.ndarray:
    if (rng is None) == (random_bits is None):
        raise ValueError("stochastic rounding needs exactly one of rng= (a numpy Generator) "
                         "or random_bits= (uint32 words, one per element)")
    if random_bits is not None:
        words = np.asarray(random_bits)
        if words.dtype != np.uint32 or words.shape != shape:
            raise ValueError(f"random_bits must be uint32 of shape {shape}, "
                             f"got {words.dtype} {words.shape}")
        return words.astype(np.uint64)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return draw_random_words(shape, rng).astype(np.uint64)


def draw_random_words(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """The uint32 words stochastic rounding consumes, one per element, from `rng`."""
    return rng.integers(0, 2**32, size=shape, dtype=np.uint32)


def decode(codes: object, fmt: str | FloatFormat, dtype: type = np.float64) -> np.ndarray:
    """The exact value of each code (float64 by default; float32 if every value fits)."""
    fmt = get_format(fmt)
    c = np.asarray(codes)
    if c.dtype.kind not in "ui":
        raise TypeError(f"decode expects integer codes, got dtype {c.dtype}")
    if np.any((c < 0) | (c >= 2**fmt.bits)):
        raise ValueError(f"codes out of range for the {fmt.bits}-bit format {fmt.name}")
    if dtype not in (np.float32, np.float64):
        raise TypeError("decode produces float32 or float64")
    if dtype == np.float32 and (fmt.exponent_bits > 8 or fmt.mantissa_bits > 23):
        raise ValueError(f"{fmt.name} values are not all float32 values; decode to float64")
    c = c.astype(np.uint64)
    m = fmt.mantissa_bits
    negative = (c >> np.uint64(fmt.bits - 1)) == 1
    field = ((c >> np.uint64(m)) & np.uint64(2**fmt.exponent_bits - 1)).astype(np.int64)
    frac = (c & np.uint64(2**m - 1)).astype(np.int64)
    # value = M * 2^(max(E, 1) - bias - m); M < 2^53 and the power is in range, so ldexp is exact.
    big_m = np.where(field > 0, frac + 2**m, frac)
    with np.errstate(over="ignore"):
        value = np.ldexp(big_m.astype(np.float64), np.maximum(field, 1) - fmt.bias - m)
    magnitude = c & np.uint64(2 ** (fmt.bits - 1) - 1)
    value = np.where(magnitude == fmt.nan_code, np.nan, value)
    if fmt.convention == "ieee":
        top = 2**fmt.exponent_bits - 1
        value = np.where((field == top) & (frac == 0), np.inf, value)
        value = np.where((field == top) & (frac != 0), np.nan, value)
    value = np.where(negative, -value, value)
    return value.astype(dtype)


def quantize(
    x: object,
    fmt: str | FloatFormat,
    *,
    rounding: str = "nearest_even",
    rng: np.random.Generator | None = None,
    random_bits: np.ndarray | None = None,
    overflow: str | None = None,
    subnormals: bool = True,
    via: str | None = None,
) -> np.ndarray:
    """Each element of float32/float64 `x` replaced by the member of `fmt` rounding picks.

    rounding     "nearest_even" (default), "toward_zero", or "stochastic" (unbiased; needs
                 rng= a numpy Generator, or random_bits= uint32 words of x's shape).
    overflow     what a result beyond `fmt.max` becomes: "inf", "saturate" (+-max, +-inf
                 included), or "nan". Default: PyTorch's behaviour for the format (inf for
                 IEEE formats, saturate for float8_e4m3fn; NOTE [ float8_e4m3fn overflow ];
                 saturate for other fn formats), and "saturate" for toward_zero (IEEE 754).
    subnormals   False flushes results that would be subnormal to signed zero.
    via          "float32": round float64 input to float32 first, as torch and ml_dtypes do
                 (double rounding). Default: one correct rounding.
    Returns an array of x's dtype; `fmt` must fit in that dtype.
    """
    fmt = get_format(fmt)
    a = _as_float_array(x)
    if a.dtype == np.float32 and (fmt.exponent_bits > 8 or fmt.mantissa_bits > 23):
        raise ValueError(f"{fmt.name} values do not all fit in float32 input's dtype")
    codes = encode(a, fmt, rounding=rounding, rng=rng, random_bits=random_bits,
                   overflow=overflow, subnormals=subnormals, via=via)
    return decode(codes, fmt, dtype=np.float64).astype(a.dtype)


def ulp_distance(a: np.ndarray, b: np.ndarray, fmt: str | FloatFormat) -> np.ndarray:
    """How many members of `fmt` lie between a and b (both members; NaN pairs: 0). uint64.

    Counted on the monotone codes: same sign, |code_a - code_b|; opposite signs, the two
    magnitudes' codes add up (+0 and -0 are 0 apart). Exact for every format, float64 too.
    """
    fmt = get_format(fmt)
    a, b = np.asarray(a), np.asarray(b)
    policy = "inf" if fmt.inf_code is not None else "nan"
    ca = encode(a.astype(np.float64), fmt, overflow=policy).astype(np.uint64)
    cb = encode(b.astype(np.float64), fmt, overflow=policy).astype(np.uint64)
    sign = np.uint64(fmt.bits - 1)
    magnitude = np.uint64(2 ** (fmt.bits - 1) - 1)
    ma, mb = ca & magnitude, cb & magnitude
    same_sign = (ca >> sign) == (cb >> sign)
    distance = np.where(same_sign, np.maximum(ma, mb) - np.minimum(ma, mb), ma + mb)
    return np.where(np.isnan(a) & np.isnan(b), np.uint64(0), distance)
