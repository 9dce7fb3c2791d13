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

Every range property is derived from (e, m, convention), never pasted (format_spec.py). A
*member* of a format is a value it represents exactly: encode(x) then decode gives x back bit
for bit (+-0 and, in IEEE formats, +-inf included; NaN is no member).

Rounding works on the integers, the lesson of this module. A finite x is M * 2^q exactly
(M the integer significand with its hidden bit, q an integer). At x's binade the target's
spacing is 2^(t - m) with t = max(floor(log2|x|), 1 - b), so rounding drops the low
`shift = t - m - q` bits of M:

    kept = M >> shift,  rest = M mod 2^shift,  half = 2^(shift - 1)
    nearest_even:  kept += (rest > half) or (rest == half and kept is odd)
    toward_zero:   kept unchanged
    stochastic:    kept += (u < top 32 bits of rest), u a uniform random 32-bit word
    |code| = ((t - (1 - b)) << m) + kept

Worked tie, float32 1 + 2^-8 (bits 0x3F808000) to bfloat16: M = 0x808000, shift = 16,
kept = 0x80 (even), rest = 0x8000 = half: a tie, kept is even, so the result is 1.0 (0x3F80).
One float32 ulp above, rest > half and the result is 1 + 2^-7 (0x3F81).

The code is monotone in |x|, for normals and subnormals alike, so the binade and the
significand travel in one integer, W = ((t - (1 - b)) << (m + shift)) + M: its low `shift`
bits are `rest`, the bits above are |code| before rounding. Rounding W is rounding M, and a
carry out of the significand (kept = 2^(m+1)) lands on the next binade by itself. That is
why rounding up is an integer +1 and why overflow is a comparison of codes. Nearest-even in
one carry: W + half - 1 + (kept & 1) carries past the dropped bits exactly when rest > half,
or rest == half and kept is odd.

`encode_stepwise` is these steps as written, over the whole array: `_decompose` (sign, W,
shift, NaN), `_round` (the three lines above), `pack` (overflow policy, NaN, sign;
reference/small_formats.py, which also rounds the exponent-only E8M0).
`encode` gives the same codes block by block (reference/encode_kernels.py), for every
convention: nearest-even
with the carry at one shift for every element, and below the target's smallest normal,
where the shift varies, one float addition that rounds at the subnormal spacing (NOTE
[ Nearest-even in two ranges ]); toward_zero and stochastic run W and shift as written.

Double rounding: rounding float64 to float32 first, then to the target, can differ from
rounding once: 1 + 2^-8 + 2^-40 rounds to float32 1 + 2^-8, a tie that bfloat16 breaks to
1.0, while the correctly rounded bfloat16 is 1 + 2^-7 = 1.0078125. torch, and ml_dtypes up
to 0.6, round twice (NOTE [ Double rounding in the libraries ]). `quantize` rounds float64
once by default; `via="float32"` reproduces the libraries that round twice.

The torch twin (torch_impl/formats.py) has the same public names in the same order; it
builds `encode` on `quantize` (a torch cast yields values, whose bits are the codes), where
this module builds `quantize` on `encode` (the rounding works on codes). `encode_stepwise`
(the statement of the rounding) exists here only; measuring in a format (`is_member`,
`ulp_distance`) is the proof's ruler, parity/ulps.py.
"""

from __future__ import annotations

import numpy as np

from common import arg_ranges
from common.format_spec import (  # noqa: F401  (the formats, re-exported)
    FLOAT64,
    FORMATS,
    Convention,
    FloatFormat,
    get_format,
)
from reference.encode_kernels import encode_blocks
from reference.small_formats import decode_values, encode_unsigned, pack

# the declared ranges (common/arg_ranges.py), which the strategies read too
ROUNDING_MODES = arg_ranges.ROUNDING_MODES
OVERFLOW_POLICIES = arg_ranges.OVERFLOW_POLICIES

# NOTE [ float8_e4m3fn overflow ]
# float8_e4m3fn has no infinity, so what a value beyond max (or +-inf) becomes is a policy.
# PyTorch >= 2.13 saturates: every such value, +-inf included, casts to +-448 (the C++
# conversion fp8e4m3fn_from_fp32_value, compiled for CPU and CUDA, pytorch/pytorch#178817,
# merged 2026-04-17; CUDA builds against CUDA >= 13.2 call NVIDIA's saturating conversion
# instead). PyTorch 2.6-2.12 and ml_dtypes give NaN. Measured on CPU, from float32, float64,
# float16 and bfloat16, 0-d and vectorized: NaN on torch 2.6.0, 2.7.1, 2.8.0, 2.11.0, 2.12.0
# and 2.12.1, saturation on 2.13.0; the casts of every 61st float32 pattern up to 464 are the
# same codes on all seven. Values in (448, 464] round to 448 in all of them: 464 is the tie
# between 448 (1.110b * 2^8, even) and 480, the first value beyond the format. The reference
# follows current torch by default; overflow="nan" reproduces older torch and ml_dtypes.
# The torch twin picks its default from the installed torch's version.
DEFAULT_OVERFLOW: dict[str, str] = {
    "float8_e4m3fn": "saturate",
    # torch 2.13 and ml_dtypes 0.7 both give the NaN (measured; claim formats.small_overflow)
    "float8_e4m3fnuz": "nan", "float8_e5m2fnuz": "nan", "float8_e4m3b11fnuz": "nan",
    "float8_e8m0fnu": "nan",
}

# NOTE [ Double rounding in the libraries ]
# torch's float64 -> low-precision cast rounds through float32 (claim formats.encode_f64_via_f32
# holds it to via="float32"). So does ml_dtypes' up to 0.6.0: its NumPy cast (NPyCast in
# ml_dtypes/_src/custom_float.h) is static_cast<To>(static_cast<float>(from)) in every
# release through 0.6.0, and 0.5.4 and 0.6.0 measure so. ml_dtypes 0.7.0 rounds float64 once,
# to every one of its formats (measured). parity/test_formats.py holds the installed
# ml_dtypes to this statement for its version.


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

    See `quantize` for the arguments; this is the same rounding, stopping at the bits. The
    codes are `encode_stepwise`'s (below: the rounding as this docstring states it), computed
    block by block in reference/encode_kernels.py (NOTE [ Encoding in blocks ]), several
    times faster; tests/test_encode_fast.py holds the two bit-equal.
    """
    fmt, x, overflow, words = _prepare(x, fmt, rounding, rng, random_bits, overflow, via,
                                       subnormals)
    if overflow == "saturate_finite":  # NOTE [ Toward zero keeps infinities ]
        return _infinities_kept(encode_blocks(x, fmt, rounding, words, "saturate",
                                              subnormals), x, fmt)
    return encode_blocks(x, fmt, rounding, words, overflow, subnormals)


def encode_stepwise(
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
    """`encode`, written as the module docstring states it: decompose, round, pack, each a
    plain NumPy expression over the whole array. The same arguments and the same codes."""
    fmt, x, overflow, words = _prepare(x, fmt, rounding, rng, random_bits, overflow, via,
                                       subnormals)
    if overflow == "saturate_finite":  # NOTE [ Toward zero keeps infinities ]
        return _infinities_kept(_stepwise(x, fmt, rounding, words, "saturate", subnormals),
                                x, fmt)
    return _stepwise(x, fmt, rounding, words, overflow, subnormals)


# NOTE [ Toward zero keeps infinities ]
# IEEE 754-2019 7.4: "roundTowardZero shall carry all overflows to the format's largest
# finite number": a finite x beyond max becomes +-max. An infinite x is no overflow: the
# conversion of an infinity is exact (5.4.2), so +-inf stays +-inf. That is the policy
# "saturate_finite", toward_zero's default in a format with an infinity ("saturate", which
# this project's toward_zero defaulted to before, also turns +-inf into +-max: the OCP OFP8
# saturating conversion, still there to be asked for). A format without an infinity
# saturates both.


def _infinities_kept(codes: np.ndarray, x: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """codes with +-inf's code wherever x is +-inf (NOTE [ Toward zero keeps infinities ])."""
    inf = np.isinf(x)
    if not inf.any():
        return codes
    sign = np.signbit(x).astype(codes.dtype) << codes.dtype.type(fmt.bits - 1)
    return np.where(inf, codes.dtype.type(fmt.inf_code) | sign, codes)


def _stepwise(x: np.ndarray, fmt: FloatFormat, rounding: str, words: np.ndarray | None,
              overflow: str, subnormals: bool) -> np.ndarray:
    if fmt.convention == "unsigned":  # powers of two only (reference/small_formats.py)
        return encode_unsigned(x, fmt, rounding, words, overflow)
    sign, w, shift, nan = _decompose(x, fmt)
    kept = _round(w, shift, rounding, words)
    return pack(kept, sign, nan, fmt, overflow, subnormals)


def _decompose(x: np.ndarray, fmt: FloatFormat) -> tuple[np.ndarray, ...]:
    """(sign, W, shift, nan) of each element of float32/float64 x, for the target fmt:
    |x| = M * 2^q, t = max(floor(log2|x|), 1 - b), shift = t - m - q, and
    W = ((t - (1 - b)) << (m + shift)) + M (uint64; sign uint64, shift int64, nan bool)."""
    src = FORMATS["float32"] if x.dtype == np.float32 else FLOAT64
    word = x.view(np.uint32 if src.bits == 32 else np.uint64).astype(np.uint64)
    sign = word >> np.uint64(src.bits - 1)
    field = ((word >> np.uint64(src.mantissa_bits)) & np.uint64(2**src.exponent_bits - 1))
    field = field.astype(np.int64)  # E, the source's biased exponent
    frac = (word & np.uint64(2**src.mantissa_bits - 1)).astype(np.int64)  # F
    nan = (field == 2**src.exponent_bits - 1) & (frac != 0)
    big_m = np.where(field > 0, frac + 2**src.mantissa_bits, frac)  # M: the hidden bit
    q = np.maximum(field, 1) - src.bias - src.mantissa_bits
    # floor(log2|x|) = E - bias for a normal; a source subnormal lies below 2^(1 - bias),
    # which is at or below the target's 2^(1 - b) (_source makes sure): t is 1 - b either
    # way. (+-inf and NaN, E = top, land a binade above the source's max: past any target.)
    t = np.maximum(np.maximum(field, 1) - src.bias, fmt.min_exponent)
    shift = t - fmt.mantissa_bits - q  # >= m_src - m >= 0
    # t - (1 - b) is 0 wherever shift is more than m_src - m (NumPy shifts 0 by any amount to 0)
    w = ((t - fmt.min_exponent) << (fmt.mantissa_bits + shift)) + big_m
    return sign, w.astype(np.uint64), shift, nan


def _round(w: np.ndarray, shift: np.ndarray, rounding: str,
           u: np.ndarray | None) -> np.ndarray:
    """kept: W with its low `shift` bits dropped by the rounding rule (the module docstring's
    three lines; `u` the uint64 words of stochastic rounding)."""
    # W < 2^63, so dropping 63 bits drops all of it, as dropping more would: the shift is
    # capped where NumPy's shifts need it (below the word's width).
    s = np.minimum(shift, 63).astype(np.uint64)
    kept = w >> s
    rest = w - (kept << s)
    if rounding == "nearest_even":
        # rest > half or (rest == half and kept odd), half = 2^(shift - 1); compared doubled
        # (2 rest against 2^shift), so that shift = 0 (nothing dropped) is no tie
        twice, spacing = rest << np.uint64(1), np.uint64(1) << s
        odd = (kept & np.uint64(1)) == 1
        kept = kept + ((twice > spacing) | ((twice == spacing) & odd))
    elif rounding == "stochastic":
        # NOTE [ Stochastic rounding with 32-bit words ] (encode_kernels.py): the top 32 of
        # the `shift` dropped bits, floor(rest * 2^32 / 2^shift). Where shift > m_src - m,
        # W is M < 2^53, so past 63 the floor is rest >> (shift - 32), and 0 from shift 85 on:
        # min(shift, 95) keeps NumPy's shift below the word's width and the floor as it is.
        top32 = np.where(shift <= 32, rest << (np.uint64(32) - np.minimum(s, np.uint64(32))),
                         rest >> (np.minimum(shift, 95).astype(np.uint64) - np.uint64(32)))
        kept = kept + (u < top32)
    return kept  # toward_zero: kept as it is


def _prepare(x: object, fmt: str | FloatFormat, rounding: str, rng: object,
             random_bits: object, overflow: str | None, via: str | None,
             subnormals: object) -> tuple[FloatFormat, np.ndarray, str, np.ndarray | None]:
    """encode's checks: (the format, x as the rounding reads it, the overflow policy that
    applies, the uint64 words of stochastic rounding or None)."""
    fmt = get_format(fmt)
    x = _check_input(x)
    overflow = _check_policies(fmt, rounding, overflow, rng, random_bits, subnormals)
    words = _random_words(x.shape, rng, random_bits) if rounding == "stochastic" else None
    return fmt, _source(x, fmt, via), overflow, words


def _check_input(x: object) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise TypeError(f"expected floating-point input, got dtype {a.dtype}")
    if a.dtype not in (np.float32, np.float64):
        raise TypeError(f"expected a float32 or float64 array, got dtype {a.dtype}")
    return np.ascontiguousarray(a).reshape(a.shape)  # (ascontiguousarray makes 0-d 1-d)


def _check_policies(fmt: FloatFormat, rounding: str, overflow: str | None,
                    rng: object, random_bits: object, subnormals: object) -> str:
    """Refuse unknown modes and policies and a subnormals flag that is no bool; return the
    overflow policy that applies."""
    arg_ranges.check_flag("encode", "subnormals", subnormals)
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; accepted: {', '.join(ROUNDING_MODES)}")
    if rounding != "stochastic" and (rng is not None or random_bits is not None):
        raise ValueError("rng= and random_bits= apply to rounding='stochastic' only")
    if overflow is None:
        # IEEE 754 7.4: rounding toward zero carries overflow to the largest finite value
        # (NOTE [ Toward zero keeps infinities ]).
        default = DEFAULT_OVERFLOW.get(fmt.name, "inf" if fmt.inf_code is not None else "saturate")
        finite = "saturate_finite" if fmt.inf_code is not None else "saturate"
        overflow = finite if rounding == "toward_zero" else default
    if overflow not in OVERFLOW_POLICIES:
        raise ValueError(
            f"unknown overflow {overflow!r}; accepted: {', '.join(OVERFLOW_POLICIES)}")
    if overflow in ("inf", "saturate_finite") and fmt.inf_code is None:
        raise ValueError(f"{fmt.name} has no infinity; use overflow='saturate' or 'nan'")
    if overflow == "nan" and fmt.convention == "finite":
        raise ValueError(f"{fmt.name} has no NaN and no infinity; overflow saturates")
    return overflow


def _source(x: np.ndarray, fmt: FloatFormat, via: str | None) -> np.ndarray:
    """x as the rounding reads it: float32, or float64 where the target is as wide as float32
    somewhere (exact: float32 values are float64 values); with via="float32", float64 input
    rounded to float32 first."""
    if via is not None:
        if via != "float32" or x.dtype != np.float64:
            raise ValueError("via='float32' applies to float64 input only (and is the only via)")
        x = decode(encode(x, "float32"), "float32", dtype=np.float32)
    if x.dtype == np.float32 and (fmt.mantissa_bits >= 23 or fmt.min_exponent < -126
                                  or fmt.max_exponent > 128):
        with np.errstate(invalid="ignore"):  # a signalling NaN is quieted: it stays a NaN
            x = x.astype(np.float64)
    return x


def _random_words(shape: tuple[int, ...], rng: np.random.Generator | None,
                  random_bits: object) -> np.ndarray:
    """The uint64 words u of stochastic rounding, one per element, each in [0, 2^32)."""
    if (rng is None) == (random_bits is None):
        raise ValueError("stochastic rounding needs exactly one of rng= (a numpy Generator) "
                         "or random_bits= (integers in [0, 2^32), one per element)")
    if random_bits is None:
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        return draw_random_words(shape, rng).astype(np.uint64)
    words = np.asarray(random_bits)
    if words.dtype.kind not in "ui":
        raise TypeError(f"random_bits must be integers, got dtype {words.dtype}")
    if words.shape != shape:
        raise ValueError(f"random_bits must have x's shape {shape}, got {words.shape}")
    if words.size and (words.min() < 0 or words.max() >= 2**32):
        raise ValueError("random_bits must lie in [0, 2^32)")
    return words.astype(np.uint64)


def draw_random_words(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """The words stochastic rounding consumes: uint32, one per element, from `rng`."""
    return rng.integers(0, 2**32, size=shape, dtype=np.uint32)


def decode(codes: object, fmt: str | FloatFormat, dtype: type = np.float64) -> np.ndarray:
    """The exact value of each code (float64 by default; float32 if every value fits)."""
    fmt = get_format(fmt)
    c = np.asarray(codes)
    if c.dtype.kind not in "ui":
        raise TypeError(f"decode expects integer codes, got dtype {c.dtype}")
    if c.size and (c.min() < 0 or c.max() >= 2**fmt.bits):
        raise ValueError(f"codes out of range for the {fmt.bits}-bit format {fmt.name}: "
                         f"expected [0, 2^{fmt.bits})")
    if np.dtype(dtype) not in (np.float32, np.float64):
        raise TypeError(f"decode produces float32 or float64, got {dtype}")
    if np.dtype(dtype) == np.float32 and (fmt.exponent_bits > 8 or fmt.mantissa_bits > 23):
        raise ValueError(f"{fmt.name} values are not all float32 values; decode to float64")
    value = decode_values(c.astype(np.uint64), fmt)
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
                 rng= a numpy Generator, or random_bits= integers in [0, 2^32) of x's shape).
    overflow     what a result beyond `fmt.max` becomes: "inf", "saturate" (+-max, +-inf
                 included), "nan", or "saturate_finite" (+-max, +-inf kept: formats with an
                 infinity). Default: PyTorch's behaviour for the format (inf for IEEE
                 formats, saturate for float8_e4m3fn; NOTE [ float8_e4m3fn overflow ];
                 saturate for other fn formats), and for toward_zero IEEE 754's:
                 "saturate_finite" (NOTE [ Toward zero keeps infinities ]), "saturate" in a
                 format without an infinity.
    subnormals   False flushes results that would be subnormal to signed zero.
    via          "float32": round float64 input to float32 first, as torch and ml_dtypes
                 <= 0.6 do (double rounding; NOTE [ Double rounding in the libraries ]).
                 Default: one correct rounding.
    Returns an array of x's dtype and shape; `fmt` must fit in that dtype.
    """
    fmt = get_format(fmt)
    a = _check_input(x)
    if a.dtype == np.float32 and (fmt.exponent_bits > 8 or fmt.mantissa_bits > 23):
        raise ValueError(f"{fmt.name} values do not all fit in float32 input's dtype")
    codes = encode(a, fmt, rounding=rounding, rng=rng, random_bits=random_bits,
                   overflow=overflow, subnormals=subnormals, via=via)
    return decode(codes, fmt, dtype=np.float64).astype(a.dtype)
